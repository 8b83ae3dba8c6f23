#!/bin/bash
# Pause of a factor-1 topic's move (docs/src/cluster.md, "Draining a broker,
# moving a topic"): etcd + 2 brokers on loopback (ports 23791/23801,
# 16650-16651, metrics 16660-16661: free them first), topic `big` filled with
# MB MiB of 10 KiB messages (`ricochet perf produce`, 4 producers), then a
# producer at 100 msg/s (1 KiB, one send at a time) while `ricochet cluster
# move big` runs. Prints the move's line (entries, "unavailable ms"), the
# producer's latency summary (its max is the longest a publish waited: the
# pause it saw) and the source's "topic moved" log line (entries copied while
# stopped). Usage: benches/move_pause.sh BIN_DIR MB, BIN_DIR holding the
# `ricochet-broker` and `ricochet` binaries (e.g. target/debug after
# `cargo build -p ricochet-broker -p ricochet-cli`).
BIN=$1; MB=$2
D=$(mktemp -d /tmp/move-pause.XXXX)
etcd --name m --data-dir $D/etcd --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 \
  --listen-peer-urls http://127.0.0.1:23801 --initial-advertise-peer-urls http://127.0.0.1:23801 \
  --initial-cluster m=http://127.0.0.1:23801 --log-level error >$D/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1; do
  $BIN/ricochet-broker --data-dir $D/b$i --listen 127.0.0.1:1665$i --cluster m --etcd http://127.0.0.1:23791 \
    --advertise http://127.0.0.1:1665$i --broker-id b$i --lease-ttl 3s --metrics-listen 127.0.0.1:1666$i >$D/b$i.log 2>&1 &
  echo $! >> $D/pids
done
sleep 4
U=http://127.0.0.1:16650
N=$((MB * 1024 / 10))
$BIN/ricochet --url $U perf produce --topic big --size 10240 --messages $N --producers 4 2>&1 | grep -E "settings|throughput|msg/s" | tail -2

$BIN/ricochet --url $U perf produce --topic big --size 1024 --rate 100 --max-pending 1 --duration 30s > $D/perf.txt 2>&1 &
PP=$!
sleep 6
date +%T.%N; $BIN/ricochet --url $U cluster move big; date +%T.%N
wait $PP
grep -E "latency ms  p50" $D/perf.txt
grep -h "topic moved\|topic received" $D/b*.log | cut -c1-300
kill $(cat $D/pids) $EP; sleep 1
du -sh $D/b0 $D/b1
rm -rf $D
