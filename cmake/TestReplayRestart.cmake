# TestReplayRestart.cmake — `kvcache replay --disk-dir` twice on one fresh
# directory (issue 43's restart goal, on a small trace): the second process
# finds the first's pages, serves disk hits from its first request and hits
# at least as often as the first. Run by ctest (cli.replay_disk_restart):
#   cmake -DCLI=<kvcache> -DTRACE=<jsonl> -DWORK=<dir> -P TestReplayRestart.cmake

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(replay_once out_var)
  execute_process(
    COMMAND "${CLI}" replay --trace "${TRACE}" --sequential --capacity 1024
            --disk-dir "${WORK}/disk" --json
    OUTPUT_VARIABLE json ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "replay exited ${rc}: ${err}")
  endif()
  set(${out_var} "${json}" PARENT_SCOPE)
endfunction()

# The disk's entry (media: device, disk) and the total.
function(read_run json prefix)
  string(JSON rate GET "${json}" block_hit_rate)
  string(JSON name GET "${json}" media 1 name)
  string(JSON first GET "${json}" media 1 first_hit_request)
  string(JSON hits GET "${json}" media 1 pages_hit)
  string(JSON at_start GET "${json}" media 1 pages_at_start)
  if(NOT name STREQUAL "disk")
    message(FATAL_ERROR "media[1] is '${name}', not disk")
  endif()
  foreach(v rate first hits at_start)
    set(${prefix}_${v} "${${v}}" PARENT_SCOPE)
  endforeach()
endfunction()

replay_once(json1)
read_run("${json1}" run1)
replay_once(json2)
read_run("${json2}" run2)
message(STATUS "first: hit rate ${run1_rate}, disk pages hit ${run1_hits}; "
               "second: ${run2_at_start} pages found, hit rate ${run2_rate}, "
               "disk pages hit ${run2_hits}, first disk hit at request ${run2_first}")
if(NOT run1_at_start EQUAL 0)
  message(FATAL_ERROR "the first run found ${run1_at_start} pages in a fresh directory")
endif()
if(run2_at_start EQUAL 0 OR NOT run2_first STREQUAL "0" OR run2_hits EQUAL 0)
  message(FATAL_ERROR "the second run did not hit the disk from its first request "
                      "(pages found ${run2_at_start}, first disk hit ${run2_first})")
endif()
if(run2_rate LESS run1_rate)
  message(FATAL_ERROR "the second run hit less: ${run2_rate} < ${run1_rate}")
endif()
file(REMOVE_RECURSE "${WORK}")
