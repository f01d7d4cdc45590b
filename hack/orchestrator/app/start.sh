#!/bin/sh
# Stand-in for a TensorFlow task's start script: its own readiness logic waits (up to 60 s) for
# every peer in TF_CONFIG (here: the comma-separated endpoints given as $1) before training.
for p in $(echo "$1" | tr ',' ' '); do
  wait-up "$p" 60 || exit 1
done
echo "all TF tasks reachable: $1"
