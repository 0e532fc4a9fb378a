# CliInputTests.cmake — ctest entries `cli.refuses_*`: hostile input to every
# command-line parser (issue 40) exits 2 with a message naming the value and
# the limit, never a signal, a hang, an "inf" or a wrapped number; and, last,
# the tests of the polished command line (presets, dtype aliases, sizes, bench
# tables, generate's timing, replay sweeps, CSV and plots; issue 42).
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
kvcache_cli_refuses(bench_manager_tiers_unknown "bogus not in" bench-manager --tiers none,bogus)
# bench-manager --tiers: every configuration runs, no write-back dropped.
add_test(NAME cli.bench_manager_tiers COMMAND sh -c
  "d=$(mktemp -d); \"$0\" bench-manager --tiers none,null,host,host+disk --steps 4 --requests 8 \
   --repeats 1 --disk-dir \"$d\"; rc=$?; rm -rf \"$d\"; exit $rc" $<TARGET_FILE:kvcache_cli>)
set_tests_properties(cli.bench_manager_tiers PROPERTIES PASS_REGULAR_EXPRESSION
  "\n  none +[0-9]+ +1\\.000.*\n  null .*\n  host +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9,]+ +0 .*\n  host\\+disk +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9,]+ +0 ")

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

# ---- the polished command line (issue 42, items 6-8) ----------------------------
set(_sweep_trace ${CMAKE_CURRENT_SOURCE_DIR}/tests/data/prefix_sweep_trace.jsonl)
# One preset namespace: a published model's name runs in demo and generate (a stand-in).
add_test(NAME cli.demo_published_preset COMMAND kvcache_cli demo --preset llama-3-8b
  --requests 4 --system-prompt 64 --max-seq-len 256 --json)
set_tests_properties(cli.demo_published_preset PROPERTIES PASS_REGULAR_EXPRESSION
  "\"head_dim\": 128.*\"kv_heads\": 8.*\"preset\": \"llama-3-8b\".*\"q_heads\": 32.*\"stand_in\": true")
add_test(NAME cli.plan_engine_preset COMMAND kvcache_cli plan --preset small --json)
set_tests_properties(cli.plan_engine_preset PROPERTIES PASS_REGULAR_EXPRESSION "\"model\": \"small\"")
# dtype aliases and the size rule (8G = 8 * 10^9 bytes, 8GiB = 8 * 2^30).
add_test(NAME cli.plan_dtype_alias COMMAND kvcache_cli plan --preset llama-3-8b --dtype half
  --memory 8G --json)
set_tests_properties(cli.plan_dtype_alias PROPERTIES PASS_REGULAR_EXPRESSION
  "\"dtype\": \"f16\".*\"memory_per_device_bytes\": 8000000000,")
add_test(NAME cli.bench_dtype_alias COMMAND kvcache_cli bench store --dtype float16 --tokens 16
  --batch 1 --repeats 1 --json)
set_tests_properties(cli.bench_dtype_alias PROPERTIES PASS_REGULAR_EXPRESSION "\"dtype\":\"f16\"")
# bench prints a table by default (the JSON behind --json).
add_test(NAME cli.bench_store_table COMMAND kvcache_cli bench store --tokens 64 --batch 2
  --repeats 3)
set_tests_properties(cli.bench_store_table PROPERTIES PASS_REGULAR_EXPRESSION
  "check against the reference +ok.*store rate +[0-9.]+ GB/s.*fraction of copy"
  FAIL_REGULAR_EXPRESSION "[{]")
add_test(NAME cli.bench_attention_table COMMAND kvcache_cli bench attention --resident cache
  --context 64 --kv-heads 2 --q-heads 4 --repeats 4 --prefetch all)
set_tests_properties(cli.bench_attention_table PROPERTIES PASS_REGULAR_EXPRESSION
  "check against the reference +ok.*fraction of stream.*prefetch +resolves to.*fastest: ")
# generate reports its timing (stderr) and has --json.
add_test(NAME cli.generate_timing COMMAND kvcache_cli generate --prompt-tokens 1,2,3
  --max-new-tokens 4)
set_tests_properties(cli.generate_timing PROPERTIES PASS_REGULAR_EXPRESSION
  "prefill 3 tokens in [0-9.]+ ms \\([0-9]+ tokens/s\\), decode 3 tokens in")
add_test(NAME cli.generate_json COMMAND kvcache_cli generate --prompt-tokens 1,2,3
  --max-new-tokens 4 --samples 2 --temperature 1 --json)
set_tests_properties(cli.generate_json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"decode_tokens\": 6,.*\"decode_tokens_per_s\":.*\"prefill_tokens_per_s\":.*\"samples\": \\[")
# replay sweeps: every pair, CSV on stdout, and the chart as well-formed SVG
# (python3's xml.etree), one polyline per policy.
add_test(NAME cli.replay_sweep_csv COMMAND kvcache_cli replay --trace ${_sweep_trace}
  --sequential --capacity 2048,unlimited --policy lru,tiered --format csv)
set_tests_properties(cli.replay_sweep_csv PROPERTIES PASS_REGULAR_EXPRESSION
  "^policy,capacity_tokens,[^\n]*\nlru,2048,4,512,6,0,0.300000,[^\n]*\nlru,0,[^\n]*\ntiered,2048,[^\n]*\ntiered,0,26,512,6,0,0.500000,0.500000,20,10,0,4,[0-9]+\n$")
add_test(NAME cli.replay_plot_svg COMMAND sh -c
  "d=$(mktemp -d) && \"$0\" replay --trace \"$1\" --sequential --capacity 1024,2048,0 \
   --policy lru,tiered,s3fifo --plot \"$d/hit.svg\" --csv \"$d/hit.csv\" >/dev/null && \
   python3 -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); \
n = len(r.findall(\"{http://www.w3.org/2000/svg}polyline\")); print(n, \"polylines\"); sys.exit(n != 3)' \
   \"$d/hit.svg\" && [ $(wc -l < \"$d/hit.csv\") -eq 10 ]; rc=$?; rm -rf \"$d\"; exit $rc"
  $<TARGET_FILE:kvcache_cli> ${_sweep_trace})
set_tests_properties(cli.replay_plot_svg PROPERTIES PASS_REGULAR_EXPRESSION "^3 polylines")
# .png goes through gnuplot: a PNG where it is installed, else exit 2 naming it.
add_test(NAME cli.replay_plot_png COMMAND sh -c
  "d=$(mktemp -d); out=$(\"$0\" replay --trace \"$1\" --sequential --plot \"$d/hit.png\" 2>&1 >/dev/null); \
   rc=$?; if command -v gnuplot >/dev/null; then [ $rc -eq 0 ] && head -c 4 \"$d/hit.png\" | grep -q PNG; \
   else echo \"$out\"; [ $rc -eq 2 ] && echo \"$out\" | grep -q gnuplot-nox; fi; ok=$?; rm -rf \"$d\"; exit $ok"
  $<TARGET_FILE:kvcache_cli> ${_sweep_trace})
kvcache_cli_refuses(replay_capacity_list_empty_field "has an empty field 2"
  replay --trace ${_sweep_trace} --capacity 1M,,3M)
kvcache_cli_refuses(replay_belady_timed "needs --sequential"
  replay --trace ${_sweep_trace} --policy lru,belady)
kvcache_cli_refuses(replay_plot_extension "must end in .svg or .png"
  replay --trace ${_sweep_trace} --sequential --plot /tmp/kvcache-hit.gif)
kvcache_cli_refuses(demo_memory_suffix "unknown suffix" demo --preset tiny --memory 32MiBs)
# bench tiers (issue 43): every tier's pages come back byte-exact, beside
# memcpy and the sequential read; a bad tier name or page count is refused.
add_test(NAME cli.bench_tiers_json COMMAND kvcache_cli bench tiers --pages 4 --layers 2
  --kv-heads 2 --head-dim 64 --repeats 1 --json)
set_tests_properties(cli.bench_tiers_json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"memcpy_gbps\":.*\"sequential_read_gbps\":.*\"name\":\"host\".*\"name\":\"host-checksums\".*\"name\":\"disk-io_uring\".*\"name\":\"disk-threads\""
  FAIL_REGULAR_EXPRESSION "\"check_ok\":false")
add_test(NAME cli.bench_tiers_table COMMAND kvcache_cli bench tiers --pages 2 --layers 1
  --kv-heads 1 --head-dim 64 --repeats 1 --tiers host,disk-threads)
set_tests_properties(cli.bench_tiers_table PROPERTIES PASS_REGULAR_EXPRESSION
  "load/seq read.*\n.*\n  host .* ok\n  disk-threads .* ok" FAIL_REGULAR_EXPRESSION "FAILED")
kvcache_cli_refuses(bench_tiers_name "'disk' is not host" bench tiers --tiers host,disk)
kvcache_cli_refuses(bench_tiers_pages "--pages must be at least 1" bench tiers --pages 0)
kvcache_cli_refuses(bench_tiers_bytes "is past the limit of 68719476736 bytes"
  bench tiers --pages 4294967295)
# replay with tiers (issue 43 item 7): hits per medium, a disk found again by
# a second process, and the tier options refused naming the value.
set(_tier_trace ${CMAKE_CURRENT_SOURCE_DIR}/tests/data/tier_replay_trace.jsonl)
add_test(NAME cli.replay_disk_restart COMMAND ${CMAKE_COMMAND} -DCLI=$<TARGET_FILE:kvcache_cli>
  -DTRACE=${_tier_trace} -DWORK=${CMAKE_BINARY_DIR}/replay-restart-test
  -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/TestReplayRestart.cmake)
# A B C C A, 2 device pages, a 1-page host writing through to a disk: the
# device serves the second C, the disk the second A (tests/replay/tier_replay_test.cpp).
add_test(NAME cli.replay_tiers_table COMMAND sh -c
  "d=$(mktemp -d); \"$0\" replay --trace \"$1\" --sequential --capacity 1024 --host-capacity 512 \
   --disk-dir \"$d\"; rc=$?; rm -rf \"$d\"; exit $rc" $<TARGET_FILE:kvcache_cli> ${_tier_trace})
set_tests_properties(cli.replay_tiers_table PROPERTIES PASS_REGULAR_EXPRESSION
  "block_hit_rate +0.2000.*\n  device +0.5000 +0.1000 +1 +3 .*\n  host +0.0000 +0.0000 +0 +- .*\n  disk +0.5000 +0.1000 +1 +4 .*modelled TTFT per request")
kvcache_cli_refuses(replay_disk_capacity_without_dir "--disk-capacity '1M' needs --disk-dir"
  replay --trace ${_tier_trace} --sequential --disk-capacity 1M)
kvcache_cli_refuses(replay_host_capacity_unlimited "--host-capacity 'unlimited'"
  replay --trace ${_tier_trace} --sequential --host-capacity unlimited)
kvcache_cli_refuses(replay_host_capacity_below_a_page "host tier capacity 100 tokens"
  replay --trace ${_tier_trace} --sequential --host-capacity 100)
kvcache_cli_refuses(replay_host_capacity_suffix "12parsecs"
  replay --trace ${_tier_trace} --sequential --host-capacity 12parsecs)
kvcache_cli_refuses(replay_disk_dir_sweep "takes one run, not 2"
  replay --trace ${_tier_trace} --sequential --disk-dir /tmp/kvcache-never-made --capacity 1K,2K)
kvcache_cli_refuses(replay_belady_tiers "replays no tiers"
  replay --trace ${_tier_trace} --sequential --host-capacity 1K --policy belady)
kvcache_cli_refuses(replay_admission_unknown "--admission 'sometimes' is not every_page or reused"
  replay --trace ${_tier_trace} --sequential --host-capacity 1K --admission sometimes)
kvcache_cli_refuses(replay_disk_gbps_0 "disk_bytes_per_s 0"
  replay --trace ${_tier_trace} --sequential --disk-gbps 0)
