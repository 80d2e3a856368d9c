// probe_load.h: the stand-in probes' streaming load.
#pragma once
#include <cstdint>

// One 16-byte load that bypasses L1 and asks L2 for its 256-byte sector
// group: how the stand-ins stream a KV-sized buffer once.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
