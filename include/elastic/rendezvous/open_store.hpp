// A store from its URL: shm://NAME on this host, etcd://HOST:PORT[,HOST:PORT] (etcds:// for TLS)
// across hosts, relay:///PATH through the host's store relay (elastic-run's). The etcd store needs elastic::etcd (ELASTIC_WITH_ETCD); without it an etcd URL
// is refused with what to link.
#pragma once

#include <memory>
#include <string_view>

#include <elastic/config.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/relay_store.hpp>
#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/rendezvous/store.hpp>
#include <elastic/rendezvous/store_url.hpp>
#if ELASTIC_WITH_ETCD
#include <elastic/rendezvous/etcd_store.hpp>
#endif

namespace elastic::inline v1::rendezvous {

#if ELASTIC_WITH_ETCD
/// Opens (an shm:// store: creates if needed) the store `url` names; `etcd` configures an etcd one.
inline std::unique_ptr<store> open_store(std::string_view url, const etcd_options& etcd = {}) {
  const store_url u = parse_store_url(url);
  if (u.scheme == store_url::kind::shm) return std::make_unique<shm_store>(u.name);
  if (u.scheme == store_url::kind::relay) return std::make_unique<relay_store>(u.name);
  return std::make_unique<etcd_store>(u, etcd);
}
#else
/// Opens (an shm:// store: creates if needed) the store `url` names.
inline std::unique_ptr<store> open_store(std::string_view url) {
  const store_url u = parse_store_url(url);
  if (u.scheme == store_url::kind::shm) return std::make_unique<shm_store>(u.name);
  if (u.scheme == store_url::kind::relay) return std::make_unique<relay_store>(u.name);
  throw error(errc::not_supported,
              "store URL '" + std::string(url) + "' needs the etcd store, which this program was built without: link "
              "elastic::etcd (libcurl)");
}
#endif

}  // namespace elastic::inline v1::rendezvous
