// The S3 API, as much of it as checkpoints need, over libcurl: put (optionally only if absent),
// get (whole or a byte range), head, delete, list, server-side copy and multipart uploads.
// Every request is signed (sigv4.hpp) for the location's bucket and region; object names are
// relative to the location's prefix. Needs libcurl (elastic::s3, ELASTIC_WITH_S3).
//
// Every request is idempotent but a put-if-absent, whose retry (s3_transport.hpp) after a lost
// answer reads 412 although our own first attempt wrote the object: put_if_absent() returns
// `exists` then and the caller compares.
//
// Bodies are sent from the caller's memory (no copy) as UNSIGNED-PAYLOAD (the signature
// covers the headers, not the bytes: no SHA-256 pass over gigabytes) with their CRC-32C in
// x-amz-checksum-crc32c (GCS: x-goog-hash), which AWS and GCS verify before they store anything;
// the checkpoint's own per-chunk CRC-32C is checked again when a step is read back.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/object_location.hpp>
#include <elastic/checkpoint/detail/s3_transport.hpp>
#include <elastic/checkpoint/detail/s3_wire.hpp>
#include <elastic/checkpoint/detail/sigv4.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/base64.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/names.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// A client for one location (bucket and prefix). Thread-safe: requests from several threads
/// run at once, each on a connection of its own.
class s3_client {
 public:
  using call = s3_transport::call;
  using gather_source = s3_transport::gather_source;
  using range_sink = s3_transport::range_sink;

  s3_client(location where, std::shared_ptr<credential_source> keys, client_options options = {})
      : transport_(std::move(where), std::move(keys), options) {}
  s3_client(location where, sigv4::credentials keys, client_options options = {})
      : s3_client(std::move(where), std::make_shared<credential_source>(std::move(keys)), options) {}

  [[nodiscard]] const location& where() const noexcept { return transport_.where(); }
  /// s3://BUCKET/PREFIX/name, for messages.
  [[nodiscard]] std::string url_of(std::string_view name) const { return transport_.url_of(name); }
  /// Requests sent so far (every attempt counts).
  [[nodiscard]] std::uint64_t requests() const noexcept { return transport_.requests(); }

  /// Writes object `name`.
  void put(std::string_view name, const gather& body) { put_object(name, body, false); }
  void put(std::string_view name, std::string_view body) { put(name, of(body)); }

  enum class put_result { written, exists };
  /// Writes object `name` unless one of that name exists (If-None-Match: *): two writers never
  /// both succeed. `exists` may also follow our own write whose answer was lost (a retry).
  put_result put_if_absent(std::string_view name, std::string_view body) {
    return put_object(name, of(body), true) == 412 ? put_result::exists : put_result::written;
  }

  /// Object `name`, whole; nothing when there is none.
  std::optional<std::string> get(std::string_view name) {
    std::string out;
    const auto r = send({.method = "GET", .name = name, .sink = &out, .allow = {404}});
    if (r.status == 404) return std::nullopt;
    return out;
  }

  /// Bytes [offset, offset + n) of object `name` into `out`. Throws errc::not_found when the
  /// object is not there, errc::corrupt when it is shorter (a truncated object).
  void get_range(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    if (out.empty()) return;
    range_sink sink{out, 0};
    const auto r = send({.method = "GET",
                         .name = name,
                         .headers = {{"range", fmt::format("bytes={}-{}", offset, offset + out.size() - 1)}},
                         .range = &sink,
                         .allow = {404, 416}});
    if (r.status == 404) throw error(errc::not_found, url_of(name) + " is not there");
    if (r.status == 416 || sink.at != out.size() || sink.overflow) {
      throw error(errc::corrupt, fmt::format("{}: bytes {}..{} asked, {} came: the object is shorter than its manifest "
                                             "says (truncated)",
                                             url_of(name), offset, offset + out.size(), r.status == 416 ? 0 : sink.at));
    }
  }

  /// The size of object `name`, or nothing when there is none.
  std::optional<std::uint64_t> size_of(std::string_view name) {
    const auto r = send({.method = "HEAD", .name = name, .allow = {404}});
    if (r.status == 404) return std::nullopt;
    return r.content_length;
  }

  /// Deletes object `name` (none there is no error).
  void erase(std::string_view name) { send({.method = "DELETE", .name = name, .allow = {404}}); }

  /// Copies object `from` to `to` on the server.
  void copy(std::string_view from, std::string_view to) {
    const std::string source = sigv4::uri_encode(where().path_style ? where().path_of(from).substr(1)
                                                                   : where().bucket + where().path_of(from),
                                                 true);
    std::string reply;
    send({.method = "PUT", .name = to, .headers = {{"x-amz-copy-source", source}}, .sink = &reply});
    // A copy can fail after its 200 has been sent: the error is in the body.
    if (reply.find("<Error>") != std::string::npos) {
      throw error(errc::unavailable, fmt::format("copy of {} to {} failed: {}", url_of(from), url_of(to),
                                                 xml::first(reply, "Message")));
    }
  }

  /// Creates the bucket (for tests and tools: a training job is given a bucket that exists).
  void create_bucket() { send({.method = "PUT", .bucket_level = true, .allow = {409}}); }

  /// Every object whose name starts with `under`, in name order.
  std::vector<object_info> list(std::string_view under = {}) {
    std::vector<object_info> out;
    const std::string prefix = where().key_of(under);
    std::string token;
    for (;;) {
      std::vector<std::pair<std::string, std::string>> q{{"list-type", "2"}, {"prefix", prefix}, {"max-keys", "1000"}};
      if (!token.empty()) q.emplace_back("continuation-token", token);
      std::string reply;
      send({.method = "GET", .bucket_level = true, .query = std::move(q), .sink = &reply});
      for (const auto b : xml::blocks(reply, "Contents")) {
        object_info o;
        o.name = xml::first(b, "Key");
        if (!o.name.starts_with(prefix)) continue;
        o.name.erase(0, prefix.size() - under.size());
        o.size = std::strtoull(xml::first(b, "Size").c_str(), nullptr, 10);
        o.last_modified = xml::first(b, "LastModified");
        out.push_back(std::move(o));
      }
      if (xml::first(reply, "IsTruncated") != "true") break;
      token = xml::first(reply, "NextContinuationToken");
      if (token.empty()) break;
    }
    return out;
  }

  // Multipart uploads: start one, send its parts (each at least 5 MiB but the last, at most
  // 10,000), complete it (the object appears whole, at once) or abort it.
  std::string start_upload(std::string_view name) {
    std::string reply;
    send({.method = "POST", .name = name, .query = {{"uploads", ""}}, .headers = checksum_algorithm(), .sink = &reply});
    std::string id = xml::first(reply, "UploadId");
    if (id.empty()) throw error(errc::unavailable, url_of(name) + ": the server started no upload: " + reply.substr(0, 200));
    return id;
  }
  struct part_done {
    int number;
    std::string etag;
    std::string crc;  ///< base64, as sent
  };
  part_done upload_part(std::string_view name, const std::string& upload_id, int number, const gather& body,
                        std::uint64_t from, std::uint64_t bytes) {
    const std::string crc = crc32c_base64(body.crc(from, bytes));
    std::vector<std::pair<std::string, std::string>> h;
    if (where().scheme == "s3") h.emplace_back("x-amz-checksum-crc32c", crc);
    gather_source src{&body, from, from + bytes};
    const auto r = send({.method = "PUT",
                         .name = name,
                         .query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}},
                         .headers = std::move(h),
                         .body = &src});
    return {number, r.etag, crc};
  }
  void complete_upload(std::string_view name, const std::string& upload_id, std::vector<part_done> parts) {
    std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.number < b.number; });
    std::string doc = "<CompleteMultipartUpload>";
    for (const auto& p : parts) {
      doc += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag>", p.number, xml::escape(p.etag));
      if (where().scheme == "s3") doc += fmt::format("<ChecksumCRC32C>{}</ChecksumCRC32C>", p.crc);
      doc += "</Part>";
    }
    doc += "</CompleteMultipartUpload>";
    std::string reply;
    send({.method = "POST", .name = name, .query = {{"uploadId", upload_id}}, .sink = &reply, .text = doc});
    if (reply.find("<Error>") != std::string::npos) {  // a 200 whose body says it failed
      throw error(errc::unavailable, fmt::format("{}: completing the upload failed: {}", url_of(name),
                                                 xml::first(reply, "Message")));
    }
  }
  void abort_upload(std::string_view name, const std::string& upload_id) {
    send({.method = "DELETE", .name = name, .query = {{"uploadId", upload_id}}, .allow = {404}});
  }
  /// The multipart uploads still open under `under`.
  std::vector<upload_info> uploads(std::string_view under = {}) {
    std::vector<upload_info> out;
    const std::string prefix = where().key_of(under);
    std::string key_marker, id_marker;
    for (;;) {
      std::vector<std::pair<std::string, std::string>> q{{"uploads", ""}, {"prefix", prefix}};
      if (!key_marker.empty()) q.emplace_back("key-marker", key_marker);
      if (!id_marker.empty()) q.emplace_back("upload-id-marker", id_marker);
      std::string reply;
      send({.method = "GET", .bucket_level = true, .query = std::move(q), .sink = &reply});
      for (const auto b : xml::blocks(reply, "Upload")) {
        upload_info u;
        u.name = xml::first(b, "Key");
        if (!u.name.starts_with(prefix)) continue;
        u.name.erase(0, prefix.size() - under.size());
        u.upload_id = xml::first(b, "UploadId");
        u.initiated = xml::first(b, "Initiated");
        out.push_back(std::move(u));
      }
      if (xml::first(reply, "IsTruncated") != "true") break;
      key_marker = xml::first(reply, "NextKeyMarker");
      id_marker = xml::first(reply, "NextUploadIdMarker");
      if (key_marker.empty()) break;
    }
    return out;
  }

 private:
  static gather of(std::string_view s) {
    return gather{{{reinterpret_cast<const std::byte*>(s.data()), s.size()}}};
  }

  std::vector<std::pair<std::string, std::string>> checksum_algorithm() const {
    if (where().scheme == "s3") return {{"x-amz-checksum-algorithm", "CRC32C"}};
    return {};
  }

  long put_object(std::string_view name, const gather& body, bool if_absent) {
    std::vector<std::pair<std::string, std::string>> h;
    const std::uint64_t n = body.size();
    const std::string crc = crc32c_base64(body.crc(0, n));
    if (where().scheme == "s3") {
      h.emplace_back("x-amz-checksum-crc32c", crc);
    } else {
      h.emplace_back("x-goog-hash", "crc32c=" + crc);
    }
    if (if_absent) {
      h.emplace_back("if-none-match", "*");
      // GCS's XML API states the same precondition as a generation: 0, no live object.
      if (where().scheme == "gs") h.emplace_back("x-goog-if-generation-match", "0");
    }
    gather_source src{&body, 0, n};
    return send({.method = "PUT",
                 .name = name,
                 .headers = std::move(h),
                 .body = &src,
                 .allow = if_absent ? std::vector<long>{412} : std::vector<long>{}})
        .status;
  }

  s3_transport::reply send(call c) { return transport_.send(std::move(c)); }

  s3_transport transport_;
};

}  // namespace elastic::inline v1::checkpoint::detail::objects
