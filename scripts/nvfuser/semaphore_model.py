#!/usr/bin/env python3
"""A model of nvFuser main's "get" protocol (csrc/multidevice/cuda_p2p.cpp) under the drop-in's
semaphore slots, run over many random interleavings of the GPU streams of every rank.

The drop-in (integrations/nvfuser/main/ipc_handle.cpp) gives exchange n of a communication the
library channel n mod SLOTS, so the last SLOTS transfers of a communication never share a
semaphore. cuda_p2p.cpp writes kIdle/kInProgress into those semaphores with stream memory
operations and never waits for a transfer to end before the next one on another stream may use
the same semaphore. This model checks which slot counts keep a program's receives from copying a
slice before the sender has it, and from waiting forever.

The program is RingAllgatherOverlapTest.RingAllgatherBasedPipeliningHostIRImplementationCudaIpc
(nvFuser main's tests/cpp/test_multidevice_host_ir_overlap.cpp): S slices in S / W rings of W
steps; step j of ring i exchanges handles (one exchange of the SEND and one of the RECV
communication), then, except at the last step, posts the send on stream (i + j) mod streams
(sendPost: kInProgress into its own and the receiver's semaphore), the receive of the next slice
on stream (i + j + 1) mod streams (recvPost: wait for kInProgress in its own semaphore, copy from
the sender, kIdle into both), then the matmul of the current slice on stream (i + j) mod streams.
No sendWait, no recvWait (a no-op for "get").

The model: every operation of every rank queued at once (a host that enqueues later only allows
fewer interleavings); a step runs the head of one stream chosen at random among those that can
run (a wait runs once its semaphore holds the value); a copy takes the sender's slice as it is
at that moment. A run fails when a matmul reads a slice that was copied before it was there
(stale) or when no stream can run while some still have work (a hang).

    python3 scripts/nvfuser/semaphore_model.py [--world W] [--slices S] [--streams N]
                                               [--slots K] [--runs R] [--seed X]
    python3 scripts/nvfuser/semaphore_model.py --check

--check (run by CI) asserts what the drop-in's default rests on: with 4 slots some interleaving
of the test at 4 ranks reads a stale slice or hangs (as one GPU run did), and with 8 and 16 slots
(the default) none of the runs at 2, 4 and 8 ranks does.
"""

import argparse
import random
import sys

IDLE, IN_PROGRESS = 0, 1


def program(world, slices, streams, slots):
    """Per rank, per stream, the queued operations, in order."""
    rings = slices // world
    queues = {(r, s): [] for r in range(world) for s in range(streams)}
    for r in range(world):
        send_to, recv_from = (r + 1) % world, (r - 1) % world
        exchange = 0
        for i in range(rings):
            for j in range(world):
                slot = exchange % slots  # both ranks count a channel's exchanges alike
                exchange += 1
                cur, nxt = (i + j) % streams, (i + j + 1) % streams
                slice_now = (r - j) % world
                slice_next = (r - j - 1) % world
                if j != world - 1:
                    # The SEND channel's semaphore here and the RECV channel's at the receiver.
                    queues[(r, cur)].append(
                        ("write", [((r, "send", slot), IN_PROGRESS), ((send_to, "recv", slot), IN_PROGRESS)])
                    )
                    queues[(r, nxt)].append(("wait", (r, "recv", slot), IN_PROGRESS))
                    queues[(r, nxt)].append(("copy", r, recv_from, i, slice_next))
                    queues[(r, nxt)].append(
                        ("write", [((r, "recv", slot), IDLE), ((recv_from, "send", slot), IDLE)])
                    )
                queues[(r, cur)].append(("matmul", r, i, slice_now))
    return queues


def run(world, slices, streams, slots, rng):
    """One random interleaving: None when it ends well, else what went wrong."""
    queues = program(world, slices, streams, slots)
    heads = {q: 0 for q in queues}
    sems = {}
    # has[r][(ring, slice)]: True once rank r holds the right data of that slice; each rank
    # starts with its own slice of every ring.
    has = {r: {(i, r): True for i in range(slices // world)} for r in range(world)}
    while True:
        runnable = []
        for q, ops in queues.items():
            if heads[q] < len(ops):
                op = ops[heads[q]]
                if op[0] != "wait" or sems.get(op[1], IDLE) == op[2]:
                    runnable.append(q)
        if not runnable:
            stuck = [q for q in queues if heads[q] < len(queues[q])]
            if stuck:
                return "hang: rank %d stream %d waits at %r" % (stuck[0] + (queues[stuck[0]][heads[stuck[0]]],))
            return None
        q = rng.choice(runnable)
        op = queues[q][heads[q]]
        heads[q] += 1
        if op[0] == "write":
            for sem, value in op[1]:
                sems[sem] = value
        elif op[0] == "copy":
            _, r, sender, i, sl = op
            has[r][(i, sl)] = has[sender].get((i, sl), False)
        elif op[0] == "matmul":
            _, r, i, sl = op
            if not has[r].get((i, sl), False):
                return "stale: rank %d, ring %d, slice %d read before the sender had it" % (r, i, sl)


def explore(world, slices, streams, slots, runs, seed):
    """The first failure of `runs` random interleavings, or None."""
    rng = random.Random(seed)
    for n in range(runs):
        failure = run(world, slices, streams, slots, rng)
        if failure is not None:
            return "run %d: %s" % (n, failure)
    return None


def check():
    failures = []
    found = explore(world=4, slices=8, streams=3, slots=4, runs=20000, seed=1)
    print("4 ranks, 4 slots: %s" % (found or "no failure found"))
    if found is None:
        failures.append("4 slots at 4 ranks: expected a stale read or a hang, none found")
    for slots in (8, 16):
        for world in (2, 4, 8):
            found = explore(world=world, slices=8, streams=3, slots=slots, runs=2000, seed=2)
            print("%d ranks, %d slots: %s" % (world, slots, found or "no failure in 2000 runs"))
            if found is not None:
                failures.append("%d slots at %d ranks: %s" % (slots, world, found))
    for f in failures:
        print("semaphore_model: FAILED: " + f, file=sys.stderr)
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--slices", type=int, default=8)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="the assertions CI runs")
    a = p.parse_args()
    if a.check:
        return check()
    if a.world < 2 or a.slices % a.world or a.streams < 1 or a.slots < 1 or a.runs < 1:
        p.error("need --world >= 2, --slices a multiple of --world, --streams, --slots, --runs >= 1")
    found = explore(a.world, a.slices, a.streams, a.slots, a.runs, a.seed)
    print(found or "no failure in %d runs" % a.runs)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
