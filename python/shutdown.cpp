// python/shutdown.cpp — calls that release the GIL, made safe at interpreter exit.
//
// The hazard (issue 40 item 6): a daemon thread inside a manager call with the
// GIL released, while the main thread finalizes the interpreter. Returning,
// the thread asks for the GIL back; CPython (before 3.14) answers by ending
// the thread with pthread_exit, whose forced unwind meets pybind11's noexcept
// gil_scoped_release destructor: "terminate called without an active
// exception", and the process aborts. The same unwind through any of our
// frames would also drop Python references without the GIL (a fatal error
// under -X dev).
//
// The cure:
//  1. Binding calls are counted while they run (CallScope: every call that
//     releases the GIL, and the whole of the calls that build many Python
//     objects). An atexit handler, registered at import, runs before
//     finalization starts. It turns automatic garbage collection off (a
//     collection can run Python code, and so hand the GIL over, inside a
//     binding call that is no longer counted) and waits, GIL released, until
//     no counted call is left.
//  2. From then on, a call from the thread that runs the exit (a later
//     atexit handler) keeps the GIL and runs normally; a call from any other
//     thread (a daemon thread) releases the GIL and parks that thread forever,
//     as CPython 3.14 does with daemon threads at finalization: the process
//     ends around it, and nothing of it meets the dying interpreter.
//  3. ReleasedGil takes the GIL back with PyEval_RestoreThread only while the
//     interpreter is not finalizing, and otherwise parks the thread too (an
//     exit that skipped the atexit handlers, e.g. after atexit._clear()).
//  4. The state is a leaked heap object, so no destructor runs at exit.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "py_common.h"

namespace kvcache::python {

namespace {

struct CallState {
  std::mutex mu;
  std::condition_variable drained;  // in_flight reached 0
  std::size_t in_flight = 0;        // counted scopes open, over all threads
  bool exiting = false;             // the atexit handler has started
  std::thread::id exit_thread;      // the thread that runs it
};

CallState& call_state() {
  static CallState* const state = new CallState;  // leaked on purpose (see 4. above)
  return *state;
}

thread_local std::size_t counted_depth = 0;  // counted scopes open on this thread

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

[[noreturn]] void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

// The atexit handler (GIL held): no more automatic collections, then wait,
// GIL released, until no counted scope is open.
void drain_calls() {
  CallState& s = call_state();
  {
    std::lock_guard lock(s.mu);
    if (s.exiting) return;  // ran already
    s.exiting = true;
    s.exit_thread = std::this_thread::get_id();
  }
  py::module_::import("gc").attr("disable")();
  py::gil_scoped_release nogil;  // atexit runs before finalization: taking it back is safe
  std::unique_lock lock(s.mu);   // released before nogil takes the GIL back
  s.drained.wait(lock, [&] { return s.in_flight == 0; });
}

}  // namespace

CallScope::CallScope() {
  CallState& s = call_state();
  std::unique_lock lock(s.mu);
  if (!s.exiting || counted_depth > 0) {  // nested in a counted scope: exit waits for it anyway
    ++s.in_flight;
    ++counted_depth;
    counted_ = true;
    return;
  }
  if (std::this_thread::get_id() == s.exit_thread) return;  // runs with the GIL held
  lock.unlock();
  PyEval_SaveThread();  // never taken back: see 2. above
  park_forever();
}

CallScope::~CallScope() {
  if (!counted_) return;
  --counted_depth;
  CallState& s = call_state();
  std::lock_guard lock(s.mu);
  if (--s.in_flight == 0) s.drained.notify_all();
}

ReleasedGil::ReleasedGil() : state_(PyEval_SaveThread()) {}

ReleasedGil::~ReleasedGil() {
  if (interpreter_finalizing()) park_forever();
  PyEval_RestoreThread(state_);
}

void register_shutdown_handler() {
  call_state();
  py::module_::import("atexit").attr("register")(py::cpp_function(
      &drain_calls, py::name("_kvcache_drain_calls"),
      py::doc("kvcache's atexit handler: waits for the binding calls in flight (see "
              "python/shutdown.cpp).")));
}

}  // namespace kvcache::python
