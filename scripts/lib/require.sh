# require_vars NAME...: what a library in scripts/lib takes from the script that sources it,
# checked when it is sourced (sourced by each library itself). Each NAME must be a variable
# (set, even to nothing) or a function defined by then; else the script stops, naming the
# library and what is missing, instead of failing later on an unbound variable or an unknown
# command halfway through its work.
require_vars() {
  local _rv_name _rv_missing=()
  for _rv_name in "$@"; do
    declare -p "$_rv_name" >/dev/null 2>&1 || declare -F "$_rv_name" >/dev/null ||
      _rv_missing+=("$_rv_name")
  done
  [ ${#_rv_missing[@]} -eq 0 ] && return 0
  echo "${BASH_SOURCE[1]##*/}: sourced by ${0##*/} without ${_rv_missing[*]} (to be defined by the script before it sources the library)" >&2
  exit 1
}
