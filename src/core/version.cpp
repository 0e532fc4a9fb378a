// kvcache::version(): the version this library was built as (kvcache/version.h).

#include "kvcache/version.h"

namespace kvcache {

const char* version() noexcept { return KVCACHE_VERSION_STRING; }

}  // namespace kvcache
