// Read-bandwidth probe for the engine benchmark: streams a buffer with 16-byte loads and keeps
// a checksum so the loads cannot be dropped.
#include "common.cuh"

struct BwParams {
    const uint4* data;
    size_t n16;
    uint32_t* sink;
};

extern "C" __global__ void read_bw(const BwParams p) {
    const uint4* data = p.data;
    const size_t n16 = p.n16;
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = ld_stream(data + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) p.sink[0] = acc;
}
