// kvcache/log.h — leveled logging through a sink the embedding program chooses.
//
// The library writes a few lines at points worth knowing about: a manager's
// construction (geometry and bytes, info), fetches that evicted cached pages
// or copied shared ones (debug), the engine's preemptions (debug), errors
// returned at the C interface (debug). It is silent by default: the level
// starts at `off` unless the environment variable KVCACHE_LOG_LEVEL names a
// level (trace, debug, info, warn, error, off; case-insensitive; "warning"
// too), read once, at the first call of any function here. A value that is
// not a level leaves logging off and says so in one line on stderr.
// set_log_level overrides it at any time.
//
// The sink receives (level, message) for every message at or above the
// level; the message carries no level, prefix or newline. The default sink
// writes "kvcache [<level>] <message>\n" to stderr with one write per line.
// Engines route the messages into their own logger with set_log_sink.
//
// Global state: the level and the sink are process-wide, the one piece of
// mutable global state the library keeps (a logger belongs to the process,
// not to a manager). Thread-safety: every function here may be called from
// any thread. The level is an atomic, so log_enabled is one load and a call
// below the level formats nothing (log_with builds its message only when
// enabled). The sink is swapped under a mutex and called outside it, from
// whichever thread logs, possibly from several threads at once: a sink must
// be thread-safe, must not throw (an exception from it is swallowed), and
// may be called once more after set_log_sink replaced it by a call that had
// already started. A sink must not call into a manager: the library's log
// points run outside the managers' locks today, but it does not promise to.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

namespace kvcache {

enum class LogLevel : std::uint8_t { trace, debug, info, warn, error, off };

using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// "trace" | "debug" | "info" | "warn" | "error" | "off" ("unknown" outside LogLevel).
std::string_view log_level_name(LogLevel level) noexcept;
// Case-insensitive level name ("warning" means warn); throws InvalidArgument
// naming the value and the levels otherwise.
LogLevel parse_log_level(std::string_view name);

// Throws InvalidArgument for a value outside LogLevel.
void set_log_level(LogLevel level);
LogLevel log_level() noexcept;
// True when a message at `level` reaches the sink (level below off and at or
// above log_level()).
bool log_enabled(LogLevel level) noexcept;

// Replaces the sink; an empty function restores the default stderr sink.
void set_log_sink(LogSink sink);

// Hands message to the sink if log_enabled(level).
void log(LogLevel level, std::string_view message) noexcept;

// Calls make_message() (returning something convertible to std::string_view,
// e.g. a std::string) and logs it, only if log_enabled(level): the way to log
// anything that costs a format. An exception from make_message propagates.
template <class MakeMessage>
void log_with(LogLevel level, MakeMessage&& make_message) {
  if (log_enabled(level)) log(level, std::forward<MakeMessage>(make_message)());
}

}  // namespace kvcache
