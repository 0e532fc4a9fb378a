# CliInputTests.cmake — ctest entries `cli.refuses_*`: hostile input to every
# command-line parser (issue 40) exits 2 with a message naming the value and
# the limit, never a signal, a hang, an "inf" or a wrapped number.
# Included from the top-level CMakeLists.txt with the other `cli.*` tests.

# kvcache_cli_refuses(<name> <text> <args...>): `kvcache <args>` exits 2 and
# its stderr holds <text> (a fixed string).
function(kvcache_cli_refuses name text)
  add_test(NAME cli.refuses_${name} COMMAND sh -c
    "exe=$1; want=$2; shift 2; out=$(\"$exe\" \"$@\" 2>&1 >/dev/null); rc=$?; \
     echo \"rc=$rc $out\" | head -c 2000; [ $rc -eq 2 ] && echo \"$out\" | grep -qF -- \"$want\""
    sh $<TARGET_FILE:kvcache_cli> ${text} ${ARGN})
endfunction()

# kvcache_trace_refuses(<name> <line> <text> <command args...>): a trace file
# holding <line> given to `kvcache <command> --trace FILE <args>` exits 2 and
# names <text>.
function(kvcache_trace_refuses name line text command)
  add_test(NAME cli.refuses_${name} COMMAND sh -c
    "exe=$1; line=$2; want=$3; cmd=$4; shift 4; f=$(mktemp); printf '%s\\n' \"$line\" > \"$f\"; \
     out=$(\"$exe\" \"$cmd\" --trace \"$f\" \"$@\" 2>&1 >/dev/null); rc=$?; rm -f \"$f\"; \
     echo \"rc=$rc $out\" | head -c 2000; [ $rc -eq 2 ] && echo \"$out\" | grep -qF -- \"$want\""
    sh $<TARGET_FILE:kvcache_cli> ${line} ${text} ${command} ${ARGN})
endfunction()

# bench-manager (item 5): --page-size 0 died of SIGFPE, --steps 0 printed inf.
kvcache_cli_refuses(bench_manager_page_size_0 "not in range 1 to 1048576"
  bench-manager --page-size 0)
kvcache_cli_refuses(bench_manager_steps_0 "not in range 1 to 1048576" bench-manager --steps 0)
kvcache_cli_refuses(bench_manager_huge_pool "more than the limit of 67108864"
  bench-manager --page-size 1 --prompt 1048576)

# replay's trace numbers (items 7 and 8), one per way the loader went wrong.
set(_ok_ids "\"output_length\": 5, \"hash_ids\": [0, 1000]}")
kvcache_trace_refuses(replay_input_wraps
  "{\"timestamp\": 0, \"input_length\": 4294967897, ${_ok_ids}"
  "input_length is 4294967897" replay --sequential)
kvcache_trace_refuses(replay_input_fraction
  "{\"timestamp\": 0, \"input_length\": 600.7, ${_ok_ids}" "input_length is 600.7"
  replay --sequential)
kvcache_trace_refuses(replay_input_negative
  "{\"timestamp\": 0, \"input_length\": -1, ${_ok_ids}" "input_length is -1" replay --sequential)
kvcache_trace_refuses(replay_input_1e20
  "{\"timestamp\": 0, \"input_length\": 1e20, ${_ok_ids}" "input_length is 1e+20"
  replay --sequential)
kvcache_trace_refuses(replay_output_huge
  "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4294967295, \"hash_ids\": [0, 1]}"
  "output_length is 4294967295" replay)
kvcache_trace_refuses(replay_hash_id_fraction
  "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1.5]}"
  "hash_ids[1] is 1.5" replay --sequential)
kvcache_trace_refuses(replay_hash_id_negative
  "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [-2, 1]}"
  "hash_ids[0] is -2" replay --sequential)
kvcache_trace_refuses(replay_ids_do_not_fit
  "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [0, 1]}"
  "input_length 1100 does not fit 2 hash ids" replay --sequential)
# The same reader behind `demo --trace`.
kvcache_trace_refuses(demo_trace_input_wraps
  "{\"timestamp\": 0, \"input_length\": 4294967897, ${_ok_ids}"
  "input_length is 4294967897" demo --preset tiny)
kvcache_cli_refuses(replay_directory "reading failed"
  replay --trace ${CMAKE_CURRENT_SOURCE_DIR}/tests/data --sequential)
kvcache_cli_refuses(replay_dev_zero "longer than the limit of 1048576 bytes"
  replay --trace /dev/zero --sequential)
foreach(_capacity nan inf 1e30M -1 1.5)
  string(MAKE_C_IDENTIFIER "${_capacity}" _id)
  kvcache_cli_refuses(replay_capacity_${_id} "token count '${_capacity}'"
    replay --trace ${CMAKE_CURRENT_SOURCE_DIR}/tests/data/reuse_hint_trace.jsonl --sequential
    --capacity=${_capacity})
endforeach()
kvcache_cli_refuses(replay_max_batch "max_batch 4294967295 exceeds the limit of 65536"
  replay --trace ${CMAKE_CURRENT_SOURCE_DIR}/tests/data/reuse_hint_trace.jsonl
  --max-batch 4294967295)
kvcache_cli_refuses(replay_rate_inf "finite positive"
  replay --trace ${CMAKE_CURRENT_SOURCE_DIR}/tests/data/reuse_hint_trace.jsonl --rate inf)

# Messages (item 10): products that wrapped, an empty prompt read as token 0,
# a request count that ended in bad_alloc.
kvcache_cli_refuses(plan_wrapped_bytes_per_token
  "one token needs 316912649835696421541200789500 bytes"
  plan --layers 4294967295 --kv-heads 4294967295 --head-dim 4294967295)
kvcache_cli_refuses(generate_max_new_tokens_wraps
  "4294967298 tokens exceeds the model's max_position"
  generate --prompt-tokens 1,2,3 --max-new-tokens 4294967295)
# (an empty argument cannot pass through a CMake list: written into the script)
add_test(NAME cli.refuses_generate_empty_prompt COMMAND sh -c
  "out=$(\"$0\" generate --prompt-tokens '' 2>&1 >/dev/null); rc=$?; echo \"rc=$rc $out\"; \
   [ $rc -eq 2 ] && echo \"$out\" | grep -qF -- '--prompt-tokens is empty'"
  $<TARGET_FILE:kvcache_cli>)
kvcache_cli_refuses(generate_empty_token_id "field 2 '' is not a token id"
  generate --prompt-tokens "1,,2")
kvcache_cli_refuses(demo_requests "4294967295 requests"
  demo --preset tiny --requests 4294967295)

# bench: --context 4294967295 wrapped into "max_seq_len is 0", --batch 4294967295 ran unbounded.
kvcache_cli_refuses(bench_context_wraps "--context 4294967295 is past the limit of 16777216"
  bench attention --context 4294967295)
kvcache_cli_refuses(bench_batch_unbounded "--batch 4294967295 is past the limit of 65536"
  bench attention --batch 4294967295)
kvcache_cli_refuses(bench_store_tokens "--tokens 4294967295 is past the limit of 16777216"
  bench store --tokens 4294967295)
kvcache_cli_refuses(bench_set_bytes "is past the limit of 274877906944 bytes"
  bench attention --batch 65536 --context 16777216)
