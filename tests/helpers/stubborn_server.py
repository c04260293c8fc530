"""A child that ignores SIGINT and SIGTERM and keeps a grandchild: only SIGKILL of the whole tree ends it.

vLLM can't be made to ignore SIGTERM on demand, so this small script stands in for that one fault.
"""
import os
import signal
import subprocess
import sys
import time

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
                          "import signal,time\n"
                          "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "print('grandchild up', flush=True)\n"
                          "time.sleep(600)"])
print(f"stubborn up pid={os.getpid()} child={child.pid}", flush=True)
print("to stderr", file=sys.stderr, flush=True)
time.sleep(600)
