// The umbrella header: everything the build enabled. Each optional part comes in with the target
// that turns its macro on: elastic::gloo (gloo_group), elastic::nccl (nccl_group), elastic::etcd
// (etcd_store, etcd:// in open_store), elastic::cuda (device snapshots).
//
//   #include <elastic/elastic.hpp>
//   auto guard = elastic::expires(30s, "allreduce");
//
// A program that wants one part only includes that part's header (say
// <elastic/timer/expires.hpp>) and pays for nothing else.
#pragma once

#include <elastic/config.hpp>
#include <elastic/crc32c.hpp>
#include <elastic/env.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/checkpoint.hpp>
#include <elastic/comm.hpp>
#include <elastic/rendezvous.hpp>
#include <elastic/timer.hpp>
