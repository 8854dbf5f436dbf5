// The umbrella header: everything the build enabled.
//
//   #include <elastic/elastic.hpp>
//   auto guard = elastic::expires(30s, "allreduce");
//
// A program that wants one part only includes that part's header (say
// <elastic/timer/expires.hpp>) and pays for nothing else.
#pragma once

#include <elastic/config.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/checkpoint.hpp>
#include <elastic/comm.hpp>
#include <elastic/rendezvous.hpp>
#include <elastic/timer.hpp>
