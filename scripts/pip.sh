# Sourced by the setup scripts: `pip_in PYTHON ARGS...` runs PYTHON's pip with ARGS, leaving out
# only the notes this machine's pip configuration causes (its extra index folders under
# file:///opt/... do not exist, and pip says so once per package); errors and other warnings
# pass through unchanged, and pip's exit status is kept.
pip_in() {
  local py=$1
  shift
  "$py" -m pip "$@" 2> >(grep -v \
    "^WARNING: Location 'file://[^']*' is ignored: it is neither a file nor a directory\.$" >&2)
}
