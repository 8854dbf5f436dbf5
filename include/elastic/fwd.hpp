// Declarations of the library's main types, for a header that only names them (a trainer's own
// header holding an `elastic::timer::watchdog*`, or declaring a function that takes an
// `elastic::checkpoint::state&`): it costs almost nothing to include, where the full headers
// bring in the standard library's heaviest parts. Include the type's own header to use it.
#pragma once

#include <cstdint>

namespace elastic::inline v1 {

enum class errc;
class error;
class event_log;
class event_value;
struct event_field;
struct event_identity;

namespace timer {
class scope;
class client;
class watchdog;
struct watchdog_options;
struct watchdog_kill_report;
struct watchdog_stats;
}  // namespace timer

namespace checkpoint {
enum class dtype : std::uint8_t;
class state;
class output_archive;
class input_archive;
class checkpointer;
struct checkpointer_options;
class training_loop;
struct loop_options;
enum class loop_reason;
class group_hook;
template <class T>
struct device_span;
class preemption_handler;
}  // namespace checkpoint

// The checkpoint types a trainer names most often, also at elastic:: (as their headers say).
using checkpoint::device_span;
using checkpoint::group_hook;
using checkpoint::loop_options;
using checkpoint::loop_reason;
using checkpoint::preemption_handler;
using checkpoint::training_loop;

namespace rendezvous {
class store;
class shm_store;
class etcd_store;
struct etcd_options;
class rendezvous;
struct rendezvous_options;
struct round_info;
}  // namespace rendezvous

namespace comm {
enum class reduce_op;
struct bfloat16;
struct float16;
struct group_options;
template <class Comm>
class elastic_group;
class gloo_communicator;
class nccl_communicator;
struct nccl_options;
using gloo_group = elastic_group<gloo_communicator>;
using nccl_group = elastic_group<nccl_communicator>;
}  // namespace comm

}  // namespace elastic::inline v1
