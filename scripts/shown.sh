# shellcheck shell=bash
# Sourced by scripts/demo. ``shown VAR=VALUE ... -- COMMAND ARGS...`` prints the
# command line exactly as it runs it (shell-quoted: paste it into a shell to run
# the same thing), the variables it sets included, then runs it.
shown() {
  local vars=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    vars+=("$1")
    shift
  done
  shift
  local line
  line=$(printf '%q ' "${vars[@]}" "$@")
  echo "\$ ${line% }"
  env "${vars[@]}" "$@"
}
