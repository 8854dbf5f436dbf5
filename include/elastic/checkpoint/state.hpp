// The registry of what makes up training state. Declared once; every snapshot and every restore
// walks it.
//
//   elastic::checkpoint::state st;
//   st.add("weights", elastic::device_span(d_w, n));   // device memory (CUDA builds)
//   st.add("adam_m", std::span<float>(host_m));        // host memory
//   st.add_shard("emb", std::span(local), offset, n);  // this rank's slice of a global buffer
//   st.add_partitioned("adam_m", m, n, rank, world);    // a slice that follows the world size
//   st.add_value("step", step);                        // trivially copyable scalars
//   st.add_object("loader", loader);                   // user type via elastic_checkpoint()
//   st.add_object("opt", save_fn, load_fn);            // bytes made and taken by two functions
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/archive.hpp>
#include <elastic/checkpoint/device_span.hpp>
#include <elastic/checkpoint/dtype.hpp>
#include <elastic/checkpoint/partition.hpp>
#include <elastic/config.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

namespace detail {
template <class M>
struct is_span : std::false_type {};
template <class T, std::size_t N>
struct is_span<std::span<T, N>> : std::true_type {};
template <class M>
struct is_device_span : std::false_type {};
template <class T>
struct is_device_span<device_span<T>> : std::true_type {};
template <class T, std::size_t N>
T* data_of(const std::span<T, N>& s) noexcept {
  return s.data();
}
template <class T>
T* data_of(const device_span<T>& s) noexcept {
  return s.data;
}
}  // namespace detail

/// Where an entry's bytes live.
enum class location : std::uint8_t { host, device };

/// What kind of thing an entry is: a buffer (copied by the snapshot engine), a small value
/// (copied when the snapshot is taken) or an object (serialized when the snapshot is taken).
enum class entry_kind : std::uint8_t { buffer, value, object };

/// This rank's contiguous slice of a global 1-D buffer, in elements.
struct shard_range {
  std::uint64_t offset = 0;        ///< first global element this rank holds
  std::uint64_t global_count = 0;  ///< elements in the whole buffer, all ranks together
};

/// One registered piece of state.
struct entry {
  std::string name;
  entry_kind kind = entry_kind::buffer;
  dtype type = dtype::bytes;
  std::vector<std::uint64_t> shape;  ///< elements per dimension; product * element_bytes == bytes
  std::size_t element_bytes = 1;     ///< sizeof the C++ element (size_of(type) unless `bytes`)
  location where = location::host;
  std::size_t bytes = 0;                     ///< buffers and values; objects: 0 until serialized
  void* data = nullptr;                      ///< buffers and values
  std::optional<shard_range> shard;          ///< buffers only
  /// Partitioned shards only (add_partitioned): each world's slices, and how the storage takes
  /// a new slice of `count` elements (it returns the memory; the old contents may be gone).
  partition_fn partition;
  std::function<void*(std::uint64_t count)> resize;
  int part_rank = 0, part_world = 1;  ///< partitioned shards: whose slice `shard` is
  std::function<void(std::vector<std::byte>&)> save;            ///< objects only
  std::function<void(std::span<const std::byte>)> load;         ///< objects only

  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// The registry. Entries keep pointers to the caller's memory: the caller keeps it alive and in
/// place as long as the state is used.
class state {
 public:
  /// A host buffer.
  template <class T>
  state& add(std::string name, std::span<T> data, std::vector<std::uint64_t> shape = {}) {
    return add_buffer<T>(std::move(name), data.data(), data.size(), location::host, std::move(shape), {});
  }
  template <class T, class A>
  state& add(std::string name, std::vector<T, A>& data, std::vector<std::uint64_t> shape = {}) {
    return add(std::move(name), std::span<T>(data), std::move(shape));
  }
  /// A device buffer: needs a build with ELASTIC_WITH_CUDA.
  template <class T>
  state& add(std::string name, device_span<T> data, std::vector<std::uint64_t> shape = {}) {
    if constexpr (!ELASTIC_WITH_CUDA) {
      throw error(errc::not_supported, "checkpoint entry '" + name +
                                           "' is device memory, but this build has no CUDA: "
                                           "link elastic::cuda (ELASTIC_WITH_CUDA=1)");
    }
    return add_buffer<T>(std::move(name), data.data, data.count, location::device, std::move(shape), {});
  }
  /// This rank's slice [offset, offset + data.size()) of a global 1-D buffer of `global_count`
  /// elements. Restoring with another number of ranks reassembles each rank's new slice.
  template <class T>
  state& add_shard(std::string name, std::span<T> data, std::uint64_t offset, std::uint64_t global_count) {
    return add_buffer<T>(std::move(name), data.data(), data.size(), location::host, {}, shard_range{offset, global_count});
  }
  template <class T>
  state& add_shard(std::string name, device_span<T> data, std::uint64_t offset, std::uint64_t global_count) {
    if constexpr (!ELASTIC_WITH_CUDA) return add(std::move(name), data);  // throws the same clear error
    return add_buffer<T>(std::move(name), data.data, data.count, location::device, {}, shard_range{offset, global_count});
  }

  /// Rank `rank` of `world`'s slice of a global 1-D buffer of `global_count` elements, split by
  /// `partition` (even by default), held in `storage`, which repartition() resizes when the world
  /// changes: the entry then names the new slice. Loading a checkpoint written by another number
  /// of ranks fills this rank's slice from theirs.
  template <class T, class A>
  state& add_partitioned(std::string name, std::vector<T, A>& storage, std::uint64_t global_count, int rank,
                         int world, partition_fn partition = even_partition) {
    return add_partitioned(
        std::move(name),
        [&storage](std::uint64_t count) {
          storage.resize(static_cast<std::size_t>(count));
          return std::span<T>(storage);
        },
        global_count, rank, world, std::move(partition));
  }
  /// The same with storage the caller manages: `resize(count)` makes room for a slice of `count`
  /// elements and returns it, as a std::span<T> (host memory) or a device_span<T>. It is called
  /// here for this world's slice, then at every repartition().
  template <class Resize>
    requires std::invocable<Resize&, std::uint64_t>
  state& add_partitioned(std::string name, Resize resize, std::uint64_t global_count, int rank, int world,
                         partition_fn partition = even_partition) {
    using memory = std::invoke_result_t<Resize&, std::uint64_t>;
    constexpr bool device = detail::is_device_span<memory>::value;
    static_assert(device || detail::is_span<memory>::value,
                  "add_partitioned: resize(count) must return a std::span<T> or an elastic::device_span<T>");
    using T = typename memory::element_type;
    static_assert(!std::is_const_v<T>, "add_partitioned: a slice is written on restore: return non-const elements");
    if (!partition) throw error(errc::invalid_argument, "sharded entry '" + name + "': no partition function");
    if constexpr (device && !ELASTIC_WITH_CUDA) return add(std::move(name), device_span<T>());  // the clear error
    const slice mine = slice_of(partition, name, global_count, rank, world);
    auto erased = [resize = std::move(resize), name](std::uint64_t count) mutable -> void* {
      const memory m = resize(count);
      if (m.size() != count) {
        throw error(errc::invalid_argument, fmt::format("sharded entry '{}': resize({}) returned {} elements", name,
                                                        count, m.size()));
      }
      return detail::data_of(m);
    };
    void* data = erased(mine.count);
    add_buffer<T>(name, static_cast<T*>(data), static_cast<std::size_t>(mine.count),
                  device ? location::device : location::host, {}, shard_range{mine.offset, global_count});
    entries_.back().partition = std::move(partition);
    entries_.back().resize = std::move(erased);
    entries_.back().part_rank = rank;
    entries_.back().part_world = world;
    return *this;
  }

  /// Gives every partitioned entry (add_partitioned) rank `rank` of `world`'s slice: its storage
  /// is resized to the new slice and the entry names it. The contents are the storage's own
  /// (a std::vector keeps what fits): the caller fills the new slice, from the ranks that held
  /// it or from a checkpoint. Entries registered with add_shard keep their fixed slice.
  void repartition(int rank, int world) {
    std::vector<slice> next;
    for (const auto& e : entries_) {  // all checked before anything changes
      if (e.partition) next.push_back(slice_of(e.partition, e.name, e.shard->global_count, rank, world));
    }
    std::size_t i = 0;
    for (auto& e : entries_) {
      if (!e.partition) continue;
      const slice s = next[i++];
      e.data = e.resize(s.count);
      e.bytes = static_cast<std::size_t>(s.count) * e.element_bytes;
      e.shape = {s.count};
      e.shard = shard_range{s.offset, e.shard->global_count};
      e.part_rank = rank;
      e.part_world = world;
    }
  }

  /// Whether any entry is a slice (add_shard or add_partitioned).
  [[nodiscard]] bool has_shards() const noexcept {
    for (const auto& e : entries_)
      if (e.shard) return true;
    return false;
  }

  /// A trivially copyable value (step counter, RNG state, a small struct), copied at snapshot.
  template <class T>
  state& add_value(std::string name, T& value) {
    static_assert(std::is_trivially_copyable_v<T>,
                  "add_value takes trivially copyable values; use add_object with an elastic_checkpoint() hook");
    entry e;
    e.name = std::move(name);
    e.kind = entry_kind::value;
    e.type = dtype_of<T>();
    e.shape = {1};
    e.element_bytes = sizeof(T);
    e.bytes = sizeof(T);
    e.data = &value;
    return push(std::move(e));
  }

  /// A user object serialized through `elastic_checkpoint(Archive&, T&)` (see archive.hpp).
  template <class T>
  state& add_object(std::string name, T& object) {
    entry e;
    e.name = name;
    e.kind = entry_kind::object;
    e.type = dtype::bytes;
    e.save = [&object](std::vector<std::byte>& out) {
      output_archive ar(out);
      ar(object);
    };
    e.load = [&object, name](std::span<const std::byte> in) {
      input_archive ar(in, "checkpoint object '" + name + "'");
      ar(object);
      ar.finish();
    };
    return push(std::move(e));
  }

  /// An object whose bytes two functions make and take: `save(out)` fills `out` when a snapshot
  /// is taken, `load(bytes)` restores from them (for types whose library has its own serializer).
  state& add_object(std::string name, std::function<void(std::vector<std::byte>&)> save,
                    std::function<void(std::span<const std::byte>)> load) {
    if (!save || !load) throw error(errc::invalid_argument, "checkpoint object '" + name + "': no save or load function");
    entry e;
    e.name = std::move(name);
    e.kind = entry_kind::object;
    e.type = dtype::bytes;
    e.save = std::move(save);
    e.load = std::move(load);
    return push(std::move(e));
  }

  [[nodiscard]] const std::vector<entry>& entries() const noexcept { return entries_; }
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  [[nodiscard]] const entry* find(std::string_view name) const noexcept {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  /// Bytes of buffers and values (objects are sized when serialized).
  [[nodiscard]] std::size_t fixed_bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& e : entries_) n += e.bytes;
    return n;
  }
  [[nodiscard]] bool has_device_entries() const noexcept {
    for (const auto& e : entries_)
      if (e.where == location::device) return true;
    return false;
  }

 private:
  template <class T>
  state& add_buffer(std::string name, T* data, std::size_t count, location where,
                    std::vector<std::uint64_t> shape, std::optional<shard_range> shard) {
    static_assert(std::is_trivially_copyable_v<std::remove_cv_t<T>>, "checkpoint buffers hold trivially copyable elements");
    static_assert(!std::is_const_v<T>, "a checkpoint buffer is written on restore: pass a span of non-const elements");
    entry e;
    e.name = std::move(name);
    e.kind = entry_kind::buffer;
    e.type = dtype_of<T>();
    e.where = where;
    e.bytes = count * sizeof(T);
    e.data = data;
    e.shard = shard;
    e.element_bytes = sizeof(T);
    if (shape.empty()) shape = {count};
    e.shape = std::move(shape);
    if (e.elements() != count) {
      throw error(errc::invalid_argument, "checkpoint entry '" + e.name + "': its shape holds " +
                                              std::to_string(e.elements()) + " elements, its memory " +
                                              std::to_string(count));
    }
    if (shard && (shard->offset > shard->global_count || count > shard->global_count - shard->offset)) {
      throw error(errc::invalid_argument, "checkpoint entry '" + e.name + "': slice [" + std::to_string(shard->offset) +
                                              ", " + std::to_string(shard->offset + count) +
                                              ") lies outside the global buffer of " +
                                              std::to_string(shard->global_count) + " elements");
    }
    return push(std::move(e));
  }

  static slice slice_of(const partition_fn& partition, const std::string& name, std::uint64_t global_count, int rank,
                        int world) {
    const auto all = partition_slices(partition, name, global_count, world);
    if (rank < 0 || rank >= world) {
      throw error(errc::invalid_argument,
                  fmt::format("sharded entry '{}': rank {} is not in a world of {} ranks", name, rank, world));
    }
    return all[static_cast<std::size_t>(rank)];
  }

  state& push(entry e) {
    if (e.name.empty() || e.name.size() > 256) {
      throw error(errc::invalid_argument, "checkpoint entry names are 1 to 256 characters, got '" + e.name + "'");
    }
    for (unsigned char c : e.name) {
      if (c < 0x20 || c == 0x7f) {
        throw error(errc::invalid_argument, "checkpoint entry name '" + e.name + "' holds a control character");
      }
    }
    if (find(e.name)) throw error(errc::invalid_argument, "checkpoint entry '" + e.name + "' is registered twice");
    if (e.kind == entry_kind::buffer && e.data == nullptr && e.bytes != 0) {
      throw error(errc::invalid_argument, "checkpoint entry '" + e.name + "' points to null");
    }
    entries_.push_back(std::move(e));
    return *this;
  }

  std::vector<entry> entries_;
};

}  // namespace elastic::inline v1::checkpoint
