"""A vLLM server's life: started, marked, kept, stopped, and asked over HTTP.

Its life: marker.py (server.json while it runs), leftovers.py (what a killed autotune left),
kept.py (the --keep-serving server: marked, listed, stopped), handover.py and logkeeper.py (the
hand-over to a kept server and its log). Starting and stopping a process tree is host/processes.py.
Over HTTP: the client and its front door, health and serving checks, /metrics, the probe.
"""
