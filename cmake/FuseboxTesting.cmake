# Helpers for registering tests.

# fusebox_camel_case(<out-var> <snake_case>): "rank_failure" -> "RankFailure",
# for CTest names of script-driven cases (GoogleTest style, no underscores).
function(fusebox_camel_case out snake)
  string(REPLACE "_" ";" _words "${snake}")
  set(_name "")
  foreach(_w IN LISTS _words)
    string(SUBSTRING "${_w}" 0 1 _first)
    string(TOUPPER "${_first}" _first)
    string(SUBSTRING "${_w}" 1 -1 _rest)
    string(APPEND _name "${_first}${_rest}")
  endforeach()
  set(${out} "${_name}" PARENT_SCOPE)
endfunction()
