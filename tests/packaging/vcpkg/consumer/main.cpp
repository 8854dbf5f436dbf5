// Prints which optional parts the linked elastic targets turned on (config.hpp defaults each
// ELASTIC_WITH_* to 0; a feature target defines it to 1).
#include <elastic/config.hpp>

#include <cstdio>

int main() {
    std::printf("elastic %s cuda=%d nccl=%d gloo=%d etcd=%d\n", ELASTIC_VERSION_STRING, ELASTIC_WITH_CUDA,
                ELASTIC_WITH_NCCL, ELASTIC_WITH_GLOO, ELASTIC_WITH_ETCD);
}
