// python/shutdown.cpp — calls that release the GIL, made safe at interpreter exit.
//
// The hazard (issue 40 item 6): a daemon thread inside a manager call with the
// GIL released, while the main thread finalizes the interpreter. Returning,
// the thread asks for the GIL back; CPython answers by ending the thread with
// pthread_exit, whose forced unwind meets pybind11's noexcept
// gil_scoped_release destructor: "terminate called without an active
// exception", and the process aborts.
//
// The cure, in three parts:
//  1. Every GIL-free call is counted (GilFreeCall). An atexit handler
//     registered at import runs before finalization starts. With the GIL
//     released, it waits until the counted calls have taken the GIL back;
//     a call made meanwhile waits too (GIL released) and then runs with the
//     GIL held, and the handler returns only once such callers hold the GIL
//     again. After the handler, calls (a later atexit handler, a daemon
//     thread) run with the GIL held: nothing of theirs can meet finalization,
//     and no thread can hold the GIL while waiting for a manager's mutex
//     that a GIL-free call holds (the on_event callback needs the GIL).
//  2. ReleasedGil takes the GIL back with PyEval_RestoreThread only while the
//     interpreter is not finalizing; otherwise (an exit that skipped the
//     atexit handlers) it parks the thread forever, as CPython 3.14 does with
//     its own daemon threads: the process ends around it.
//  3. The state is a leaked heap object, so no destructor runs at exit.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "py_common.h"

namespace kvcache::python {

namespace {

enum class Phase {
  open,      // GIL-free calls allowed
  draining,  // atexit waits for the counted calls; new calls wait for it
  closed,    // atexit is done (or nearly): calls keep the GIL
};

struct CallState {
  std::mutex mu;
  std::condition_variable changed;  // in_flight, waiting or phase changed
  std::size_t in_flight = 0;        // counted GIL-free calls
  std::size_t waiting = 0;          // calls waiting for the drain to end
  Phase phase = Phase::open;
};

CallState& call_state() {
  static CallState* const state = new CallState;  // leaked on purpose (see 3. above)
  return *state;
}

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

// The atexit handler (GIL held): waits, GIL released, until every counted
// call has taken the GIL back, then until every call that arrived meanwhile
// holds the GIL again.
void drain_calls() {
  CallState& s = call_state();
  {
    std::lock_guard lock(s.mu);
    if (s.phase != Phase::open) return;  // ran already
    s.phase = Phase::draining;
  }
  py::gil_scoped_release nogil;  // atexit runs before finalization: taking it back is safe
  std::unique_lock lock(s.mu);   // released before nogil takes the GIL back
  s.changed.wait(lock, [&] { return s.in_flight == 0; });
  s.phase = Phase::closed;
  s.changed.notify_all();
  s.changed.wait(lock, [&] { return s.waiting == 0; });
}

}  // namespace

GilFreeCall::GilFreeCall() {
  CallState& s = call_state();
  std::unique_lock lock(s.mu);
  if (s.phase == Phase::open) {
    ++s.in_flight;
    counted_ = true;
    return;
  }
  if (s.phase == Phase::closed) return;  // runs with the GIL held
  // Draining: wait for the drain with the GIL released; drain_calls returns
  // (and finalization may start) only after this thread has the GIL again.
  ++s.waiting;
  lock.unlock();
  PyThreadState* const thread = PyEval_SaveThread();
  lock.lock();
  s.changed.wait(lock, [&] { return s.phase == Phase::closed; });
  lock.unlock();  // never wait for the GIL while holding mu
  PyEval_RestoreThread(thread);
  lock.lock();
  if (--s.waiting == 0) s.changed.notify_all();
}

GilFreeCall::~GilFreeCall() {
  if (!counted_) return;
  CallState& s = call_state();
  std::lock_guard lock(s.mu);
  if (--s.in_flight == 0) s.changed.notify_all();
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
      py::doc("kvcache's atexit handler: refuses new GIL-free calls and waits for those in "
              "flight (see python/shutdown.cpp).")));
}

}  // namespace kvcache::python
