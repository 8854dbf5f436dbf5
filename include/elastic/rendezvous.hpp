// The membership part: stores (shm:// always, etcd:// with elastic::etcd), open_store() for a
// store URL, the address peers reach this host at, and rendezvous rounds.
#pragma once

#include <elastic/config.hpp>
#include <elastic/rendezvous/etcd_options.hpp>
#include <elastic/rendezvous/host_address.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/rendezvous_options.hpp>
#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/rendezvous/store.hpp>
#include <elastic/rendezvous/store_url.hpp>
#if ELASTIC_WITH_ETCD
#include <elastic/rendezvous/etcd_store.hpp>
#endif
