"""The fleet: many tunes at once, on this node's GPUs (--on local) or a Ray cluster's (--on ray).

A leaf is today's `autotune tune`, unchanged; the fleet only decides where and when each runs,
brings its run folder back, and shows them together.

    plan.py        PLAN.yaml -> leaves (errors with the line and key)
    leaf.py        one try of one leaf: the `autotune tune` program in a runs folder of its own
    local.py       --on local: this node's GPU sets, or --slots N
    ray_backend.py --on ray: one Ray actor per leaf with num_gpus = gpus_per_leaf
    runner.py      the driver: schedule, retry infrastructure failures, Ctrl-C, fleet.json
    collect.py     fleet.json, run folders into runs/, --results-uri uploads
    report.py      the live line, the table, --json
    k8s.py         `fleet render --k8s`: an Indexed Job of the same leaves
"""
