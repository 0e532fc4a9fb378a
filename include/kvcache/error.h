// kvcache/error.h — the typed errors every public entry throws.
//
// Policy (DESIGN.md §4): every public call validates its input and, on bad
// input, throws one of the types below. The message names the offending value
// and the limit it broke ("seq 7 is not claimed", "need 12 pages, 3 free").
// A call that throws leaves the object exactly as it was (strong guarantee):
// no page leaked, no length changed, no other sequence's K/V touched.
//
// Catch `kvcache::Error` to handle all of them. Each derives from a standard
// exception class so generic handlers still work.
#pragma once

#include <stdexcept>
#include <string>

namespace kvcache {

// Root of every exception the library throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A parameter is malformed or inconsistent (zero sizes, wrong dtype, bad layer
// index, mismatched span lengths, duplicate ids in one batch ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A sequence id that is not currently claimed (never claimed or released).
class UnknownSequence : public Error {
 public:
  using Error::Error;
};

// The paged pool has too few free (or evictable) pages for the request.
class OutOfPages : public Error {
 public:
  using Error::Error;
};

// A fixed capacity would be exceeded: max_seq_len, max batch size, free slots,
// or the room a previous fetch reserved.
class CapacityExceeded : public Error {
 public:
  using Error::Error;
};

// Host memory for the cache could not be obtained.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

}  // namespace kvcache
