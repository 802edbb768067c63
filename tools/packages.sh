# Sourced by tools/demo.sh and tools/test.sh. `install PACKAGE...` installs Debian packages (as
# root; otherwise it says what to install and exits); `need COMMAND PACKAGE...` installs them
# when COMMAND is not on PATH.
install() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "$0: missing $*; install it (Debian: apt-get install $*) or run as root" >&2
        exit 1
    fi
    echo "$0: installing $* (Debian packages)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
need() {
    local cmd=$1
    shift
    command -v "$cmd" >/dev/null || install "$@"
}
