// python/metrics.cpp — metrics and logging for Python: kvcache.metrics_text
// and the managers' metrics_text() (kvcache/metrics.h), set_log_level /
// log_level / set_log_handler (kvcache/log.h). See docs/metrics.md.
//
// The log handler is a Python object behind the process-wide C++ sink, which
// any thread may call, Python's or not, with or without the GIL:
//  - the sink takes the GIL for the call; a Python exception from the handler
//    goes to sys.unraisablehook and the library carries on;
//  - the handler is held by a shared_ptr whose deleter takes the GIL (a
//    thread that drops the last copy may not hold it), or leaks it once the
//    interpreter is finalizing;
//  - an atexit handler, registered at import, puts the default stderr sink
//    back before finalization, and the sink drops messages while the
//    interpreter is finalizing (a thread that asks for the GIL then would
//    hang or be ended).
#include "kvcache/metrics.h"

#include <memory>
#include <string>

#include "kvcache/log.h"
#include "py_common.h"

namespace kvcache::python {

namespace {

bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() != 0 && Py_IsFinalizing() == 0;
#else
  return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
#endif
}

// Python's logging levels for ours (trace below DEBUG, as 5).
int logging_level(LogLevel level) {
  switch (level) {
    case LogLevel::trace:
      return 5;
    case LogLevel::debug:
      return 10;
    case LogLevel::info:
      return 20;
    case LogLevel::warn:
      return 30;
    default:
      return 40;
  }
}

// The sink for a Python handler: a logging.Logger gets logger.log(levelno,
// message), any other callable handler(level_name, message).
LogSink python_sink(py::object handler) {
  const bool is_logger = py::isinstance(handler, py::module_::import("logging").attr("Logger"));
  if (!is_logger && !PyCallable_Check(handler.ptr())) {
    throw InvalidArgument(
        "set_log_handler needs a logging.Logger, a callable (level, message) "
        "or None, got " +
        py::str(py::type::of(handler)).cast<std::string>());
  }
  std::shared_ptr<py::object> fn(new py::object(std::move(handler)), [](py::object* o) {
    if (!interpreter_usable()) return;  // leaked: no GIL to take any more
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [fn, is_logger](LogLevel level, std::string_view message) {
    if (!interpreter_usable()) return;
    py::gil_scoped_acquire gil;
    try {
      const py::str text(message.data(), message.size());
      if (is_logger) {
        fn->attr("log")(logging_level(level), text);
      } else {
        (*fn)(std::string(log_level_name(level)), text);
      }
    } catch (py::error_already_set& err) {
      err.discard_as_unraisable("kvcache log handler");
    }
  };
}

void restore_default_sink() { set_log_sink({}); }

template <class M>
void add_metrics_method(py::module_& m, const char* name) {
  auto cls = py::reinterpret_borrow<py::class_<M>>(m.attr(name));
  cls.def(
      "metrics_text",
      [](const M& manager, const std::string& prefix) {
        return unlocked([&] { return metrics_text(manager, prefix); });
      },
      py::arg("prefix") = "kvcache",
      "The manager's figures in the Prometheus text format (docs/metrics.md); every name "
      "starts with prefix + '_'.");
}

}  // namespace

void bind_metrics_and_logging(py::module_& m) {
  add_metrics_method<PagedKVCacheManager>(m, "PagedKVCacheManager");
  add_metrics_method<ContinuousBatchingKVCacheManager>(m, "ContinuousBatchingKVCacheManager");
  m.def(
      "metrics_text",
      [](const py::object& manager, const std::string& prefix) {
        return manager.attr("metrics_text")(prefix);
      },
      py::arg("manager"), py::arg("prefix") = "kvcache",
      "kvcache.metrics_text(manager) == manager.metrics_text(): Prometheus text.");
  m.def(
      "set_log_level", [](const std::string& level) { set_log_level(parse_log_level(level)); },
      py::arg("level"),
      "Messages at this level and above reach the handler: 'trace', 'debug', 'info', 'warn', "
      "'error' or 'off' (the default, unless KVCACHE_LOG_LEVEL says otherwise).");
  m.def(
      "log_level", [] { return std::string(log_level_name(log_level())); },
      "The current level's name.");
  m.def(
      "set_log_handler",
      [](const py::object& handler) {
        if (handler.is_none()) {
          set_log_sink({});
        } else {
          set_log_sink(python_sink(handler));
        }
      },
      py::arg("handler"),
      "Routes kvcache's log messages to a logging.Logger (logger.log(levelno, message); "
      "trace is level 5), to a callable handler(level_name, message), or, with None, back to "
      "stderr. Process-wide; called from whichever thread logs, with the GIL taken.");
  py::module_::import("atexit").attr("register")(py::cpp_function(
      &restore_default_sink, py::name("_kvcache_restore_log_sink"),
      py::doc("kvcache's atexit handler: the default stderr log sink back before exit.")));
}

}  // namespace kvcache::python
