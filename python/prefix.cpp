// python/prefix.cpp — prefix caching of the Python PagedKVCacheManager: the
// constructor keywords (prefix_config), the on_event callback
// (event_trampoline), PageEvent and PrefixCacheMetrics, and the methods
// match_prefix, release(seq, hint), fork, truncate, pin_prefix,
// reset_prefix_cache, metrics, reset_metrics. See docs/python.md.
#include <functional>
#include <memory>
#include <string>

#include "py_common.h"

namespace kvcache::python {

namespace {

// One PageEvent as a Python object (the C++ event's token span is copied).
struct PyPageEvent {
  std::string kind;  // "stored" | "removed"
  std::uint32_t page = 0;
  std::uint64_t hash = 0;
  std::uint64_t parent_hash = 0;
  std::uint64_t extra_key = 0;
  std::vector<std::uint32_t> tokens;
  std::string medium;                           // "device" or a tier's name
  std::pair<std::uint64_t, std::uint64_t> key;  // the 128-bit tier key (hi, lo)
};

// The C++ on_event callback for a Python callable. It runs under the
// manager's mutex, in whatever thread made the call (which released the GIL,
// see `unlocked`), so it takes the GIL. A Python exception never reaches C++:
// it is reported through sys.unraisablehook (printed by default) and the
// manager carries on. The callable is held by a shared_ptr whose deleter takes
// the GIL, so copies of the std::function need no GIL.
std::function<void(const PageEvent&)> event_trampoline(py::object callback) {
  if (!PyCallable_Check(callback.ptr())) {
    throw InvalidArgument("on_event must be callable, got " +
                          py::str(py::type::of(callback)).cast<std::string>());
  }
  std::shared_ptr<py::object> fn(new py::object(std::move(callback)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [fn](const PageEvent& e) noexcept {
    py::gil_scoped_acquire gil;
    try {
      PyPageEvent ev{e.kind == PageEvent::Kind::stored ? "stored" : "removed",
                     e.page,
                     e.hash,
                     e.parent_hash,
                     e.extra_key,
                     {e.tokens.begin(), e.tokens.end()},
                     std::string(e.medium),
                     {e.key.hi, e.key.lo}};
      (*fn)(std::move(ev));
    } catch (py::error_already_set& err) {
      err.discard_as_unraisable("kvcache.PagedKVCacheManager on_event callback");
    } catch (const std::exception& err) {
      PyErr_SetString(PyExc_RuntimeError, err.what());
      PyErr_WriteUnraisable(fn->ptr());
    }
  };
}

// The prefix-cache configuration from the constructor's keywords; any of them
// without params.enable_prefix_caching is an error (the C++ would ignore it).
}  // namespace

PrefixCacheConfig prefix_config(const KVCacheParams& p, const py::object& policy,
                                const py::object& on_event, const py::object& small_fraction,
                                const py::object& ghost_factor) {
  PrefixCacheConfig c;
  const bool any = !policy.is_none() || !on_event.is_none() || !small_fraction.is_none() ||
                   !ghost_factor.is_none();
  if (any && !p.enable_prefix_caching) {
    throw InvalidArgument(
        "eviction_policy / on_event / s3fifo_small_fraction / ghost_factor need "
        "params.enable_prefix_caching=True");
  }
  if (!policy.is_none()) {
    if (!py::isinstance<py::str>(policy)) {
      throw InvalidArgument(
          "eviction_policy must be a str (lru, s3fifo, tiered, interval, adaptive)");
    }
    c.policy = parse_policy(policy.cast<std::string>());
  }
  if (!small_fraction.is_none()) c.s3fifo_small_fraction = small_fraction.cast<double>();
  if (!ghost_factor.is_none()) c.ghost_factor = ghost_factor.cast<double>();
  if (!on_event.is_none()) c.on_event = event_trampoline(on_event);
  return c;
}

void bind_prefix_types(py::module_& m) {
  py::class_<PyPageEvent>(m, "PageEvent",
                          "A page entering ('stored') or leaving ('removed') a medium: the "
                          "prefix cache's hash index (medium 'device') or a tier ('host', "
                          "'disk'), as passed to on_event.")
      .def_readonly("kind", &PyPageEvent::kind)
      .def_readonly("page", &PyPageEvent::page)
      .def_readonly("hash", &PyPageEvent::hash)
      .def_readonly("parent_hash", &PyPageEvent::parent_hash)
      .def_readonly("extra_key", &PyPageEvent::extra_key)
      .def_readonly("tokens", &PyPageEvent::tokens)
      .def_readonly("medium", &PyPageEvent::medium)
      .def_readonly("key", &PyPageEvent::key)
      .def("__repr__", [](const PyPageEvent& e) {
        return "PageEvent(" + e.kind + ", page=" + std::to_string(e.page) +
               ", hash=" + std::to_string(e.hash) + ", medium='" + e.medium + "')";
      });
  using PM = PrefixCacheMetrics;
  py::class_<PM>(m, "PrefixCacheMetrics",
                 "Prefix-cache counters since construction or reset_metrics(); page gauges "
                 "are current. Read-only.")
      .def_readonly("pages_total", &PM::pages_total)
      .def_readonly("pages_free", &PM::pages_free)
      .def_readonly("pages_used", &PM::pages_used)
      .def_readonly("pages_cached", &PM::pages_cached)
      .def_readonly("pages_pinned", &PM::pages_pinned)
      .def_readonly("match_calls", &PM::match_calls)
      .def_readonly("prompt_tokens", &PM::prompt_tokens)
      .def_readonly("reused_tokens", &PM::reused_tokens)
      .def_readonly("pages_published", &PM::pages_published)
      .def_readonly("evictions", &PM::evictions)
      .def_readonly("cow_copies", &PM::cow_copies)
      .def_property_readonly("hit_rate", &PM::hit_rate)
      .def("as_dict",
           [](const PM& x) {
             py::dict d;
             d["pages_total"] = x.pages_total;
             d["pages_free"] = x.pages_free;
             d["pages_used"] = x.pages_used;
             d["pages_cached"] = x.pages_cached;
             d["pages_pinned"] = x.pages_pinned;
             d["match_calls"] = x.match_calls;
             d["prompt_tokens"] = x.prompt_tokens;
             d["reused_tokens"] = x.reused_tokens;
             d["pages_published"] = x.pages_published;
             d["evictions"] = x.evictions;
             d["cow_copies"] = x.cow_copies;
             d["hit_rate"] = x.hit_rate();
             return d;
           })
      .def("__repr__", [](const PM& x) {
        return "PrefixCacheMetrics(hit_rate=" + std::to_string(x.hit_rate()) +
               ", reused_tokens=" + std::to_string(x.reused_tokens) +
               ", prompt_tokens=" + std::to_string(x.prompt_tokens) +
               ", pages_cached=" + std::to_string(x.pages_cached) +
               ", evictions=" + std::to_string(x.evictions) + ")";
      });
}

void bind_prefix_methods(py::class_<PagedKVCacheManager>& cls) {
  using M = PagedKVCacheManager;
  cls.def(
         "match_prefix",
         [](M& m, const py::handle& seq, const py::handle& tokens, const py::handle& extra) {
           const SeqId id = to_seq_ids(seq).at(0);
           const auto t = to_u32_vector(tokens, "prompt_tokens");
           const std::uint64_t key = to_u64(extra, "extra_key");
           return unlocked([&] { return m.match_prefix(id, t, key); });
         },
         py::arg("seq_id"), py::arg("prompt_tokens"), py::arg("extra_key") = 0,
         "Attaches the cached pages of the longest cached full-page prefix of prompt_tokens "
         "(under extra_key) to a freshly claimed sequence and returns the tokens reused "
         "(always leaves at least one prompt token to compute). Then fetch/step the rest.")
      .def(
          "release",
          [](M& m, const py::handle& seq, const std::string& hint) {
            const SeqId id = to_seq_ids(seq).at(0);
            const ReuseHint h = parse_reuse_hint(hint);
            unlocked([&] { m.release(id, h); });
          },
          py::arg("seq_id"), py::arg("hint"),
          "Releases the sequence telling the eviction policy whether a later request is "
          "expected to start with its tokens: hint 'likely' | 'unlikely' | 'unknown' (only "
          "the 'tiered' policy acts on it).")
      .def(
          "fork",
          [](M& m, const py::handle& seq) {
            const SeqId id = to_seq_ids(seq).at(0);
            return unlocked([&] { return m.fork(id); });
          },
          py::arg("seq_id"),
          "A new sequence sharing seq's pages (copy-on-write on the first write into a shared "
          "page); returns its id.")
      .def(
          "truncate",
          [](M& m, const py::handle& seq, const py::handle& length) {
            const SeqId id = to_seq_ids(seq).at(0);
            const std::uint32_t n = to_u32(length, "new_length");
            unlocked([&] { m.truncate(id, n); });
          },
          py::arg("seq_id"), py::arg("new_length"),
          "Rolls seq back to new_length (<= cache_length) tokens.")
      .def(
          "pin_prefix",
          [](M& m, const py::handle& tokens, const py::handle& priority, const py::handle& extra) {
            const auto t = to_u32_vector(tokens, "tokens");
            const std::uint32_t prio = to_u32(priority, "priority");
            const std::uint64_t key = to_u64(extra, "extra_key");
            return unlocked([&] { return m.pin_prefix(t, prio, key); });
          },
          py::arg("tokens"), py::arg("priority") = 1, py::arg("extra_key") = 0,
          "Pins the cached full pages of this prefix (evicted last, lowest priority first); "
          "priority 0 unpins. Returns the tokens covered.")
      .def("reset_prefix_cache", [](M& m) { unlocked([&] { m.reset_prefix_cache(); }); })
      .def("metrics", counted([](const M& m) { return unlocked([&] { return m.metrics(); }); }))
      .def("reset_metrics", [](M& m) { unlocked([&] { m.reset_metrics(); }); });
}

}  // namespace kvcache::python
