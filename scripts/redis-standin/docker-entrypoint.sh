#!/bin/sh
# Entrypoint of the local stand-in for the redis:7 image: the same contract as the
# official image's entrypoint, which the compose file relies on.
#
# A bare option list (or a .conf file) means "redis-server with these". A redis-server
# command gets `--protected-mode no` after its config file, unless that file sets
# protected-mode itself: inside a container every client comes from outside the loopback,
# so protected mode (on by default without a password) would refuse them all. Only the
# ports the compose file publishes are reachable.
set -e

case "$1" in
  -* | *.conf) set -- redis-server "$@" ;;
esac

if [ "$1" = redis-server ]; then
  config=
  unprotect=yes
  if [ -f "${2:-}" ]; then
    config="$2"
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in
        protected-mode*) unprotect= ;; # the file decides
      esac
    done <"$config"
  fi
  if [ -n "$unprotect" ]; then
    shift # redis-server
    if [ -n "$config" ]; then
      shift
      set -- "$config" --protected-mode no "$@"
    else
      set -- --protected-mode no "$@"
    fi
    set -- redis-server "$@"
  fi
fi

exec "$@"
