// probe_timing.h: the probes' timing, as `decode-attn bench` times: CUDA
// graphs replayed between device events, and the device-to-device copy
// bandwidth as the yardstick.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "probe_check.h"

// Milliseconds between two events recorded on `st` around what `work` issues there.
template <typename F>
static float elapsed_ms(cudaStream_t st, F work) {
    cudaEvent_t e0, e1;
    PROBE_CHECK(cudaEventCreate(&e0));
    PROBE_CHECK(cudaEventCreate(&e1));
    PROBE_CHECK(cudaEventRecord(e0, st));
    work();
    PROBE_CHECK(cudaEventRecord(e1, st));
    PROBE_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    PROBE_CHECK(cudaEventDestroy(e0));
    PROBE_CHECK(cudaEventDestroy(e1));
    return ms;
}

// Microseconds per call of an instantiated graph of `calls` calls: 3 warm-up
// replays, then max(3, 2000 / calls) replays between events.
static double replay_us(cudaStream_t st, cudaGraphExec_t exec, int calls) {
    for (int i = 0; i < 3; ++i) PROBE_CHECK(cudaGraphLaunch(exec, st));
    const int reps = std::max(3, 2000 / calls);
    const float ms = elapsed_ms(st, [&] {
        for (int i = 0; i < reps; ++i) PROBE_CHECK(cudaGraphLaunch(exec, st));
    });
    return ms * 1000.0 / ((double)reps * calls);
}

// A graph of `calls` calls (`record_call(i)` for each i) captured on `st`
// into *graph, instantiated.
template <typename F>
static cudaGraphExec_t capture_calls(cudaStream_t st, int calls, F record_call, cudaGraph_t* graph) {
    PROBE_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; ++i) record_call(i);
    PROBE_CHECK(cudaStreamEndCapture(st, graph));
    cudaGraphExec_t exec;
    PROBE_CHECK(cudaGraphInstantiate(&exec, *graph, 0));
    return exec;
}

// Microseconds per call: a graph of one call per copy, replayed.
template <typename F>
static double time_graph(cudaStream_t st, int calls, F record_call) {
    cudaGraph_t graph;
    cudaGraphExec_t exec = capture_calls(st, calls, record_call, &graph);
    const double us = replay_us(st, exec, calls);
    PROBE_CHECK(cudaGraphExecDestroy(exec));
    PROBE_CHECK(cudaGraphDestroy(graph));
    return us;
}

// The yardstick: device-to-device copy of 1 GiB on the stream (a graph's
// memcpy node is slower), in TB/s counting read + write.
static double copy_tbs_1gib(cudaStream_t st) {
    const size_t copy_bytes = (size_t)1024 << 20;
    void *src, *dst;
    PROBE_CHECK(cudaMalloc(&src, copy_bytes));
    PROBE_CHECK(cudaMalloc(&dst, copy_bytes));
    PROBE_CHECK(cudaMemset(src, 1, copy_bytes));
    PROBE_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
    const float ms = elapsed_ms(st, [&] {
        for (int i = 0; i < 10; ++i) PROBE_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
    });
    PROBE_CHECK(cudaFree(dst));
    PROBE_CHECK(cudaFree(src));
    return 2.0 * copy_bytes * 10 / (ms * 1e-3) / 1e12;
}
