"""What a dropped local server's message says about its process."""

import subprocess
import sys

from grouprl.serve.local import LocalServers


def test_a_server_still_exiting_is_named_by_its_exit_status_once_given_time(tmp_path):
    servers = LocalServers.__new__(LocalServers)
    servers.log_dir = tmp_path
    with open(servers.log_path(0), "wb") as log:  # runs until its stdin closes, as a server until it is killed
        code = "import sys; print('engine gone', flush=True); sys.stdin.read(); sys.exit(3)"
        servers.processes = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=log,
                                              stderr=subprocess.STDOUT)]
    process = servers.processes[0]
    assert servers.describe(0) == f"process {process.pid} running, log {servers.log_path(0)}"
    process.stdin.close()  # its connections are gone; the process itself needs a moment more
    said = servers.describe(0, settle=60.0)
    assert said.startswith(f"process {process.pid} exited with status 3; end of ") and said.endswith("engine gone")
