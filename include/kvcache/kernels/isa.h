// kvcache/kernels/isa.h — which instruction set the fast CPU kernels run.
//
// The fast kernels (attention, store_kv, the bandwidth probes) are compiled
// for several x86 instruction sets through Highway and pick, at run time, the
// best one this processor supports. These functions list and pin that
// choice: to measure the AVX2 path of a deployment on an AVX-512 machine,
// or to compare results across paths. Every path is tested against the
// scalar reference kernels.
//
// Names are Highway's target names, best first on this machine, for example
// {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"} on an AVX-512 x86 processor
// ("AVX3" is AVX-512 F/VL/DQ/BW).
//
// The choice is process-wide (Highway's dispatcher holds it): select_isa()
// must not run while a kernel runs on another thread. The queries are
// thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvcache {

// The instruction sets both compiled in and supported by this processor,
// best first; never empty.
std::vector<std::string> available_isas();

// The instruction set the kernels dispatch to now.
std::string active_isa();

// Makes every fast kernel dispatch to `name` (one of available_isas()), or
// back to the best with "auto". Throws InvalidArgument naming the value and
// the choices otherwise, and then changes nothing.
void select_isa(std::string_view name);

}  // namespace kvcache
