"""An ingest stopped by a signal publishes nothing and exits with the shell's 128+N status."""
import http.server
import os
import signal
import subprocess
import threading
import unittest

from harness import DSFS, DsfsTestCase, signal_delivered, wait_for


class StallingHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET only once the test releases it, so the ingest is surely in flight."""
    release = threading.Event()
    requested = threading.Event()

    def do_GET(self):
        StallingHandler.requested.set()
        StallingHandler.release.wait(60)
        body = b"x" * 100
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the interrupted ingest closed its connection first

    def log_message(self, *args):
        pass


class IngestSignalTest(DsfsTestCase):
    def interrupt_ingest(self, signum):
        StallingHandler.release.clear()
        StallingHandler.requested.clear()
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StallingHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            urls = os.path.join(self.tmp, "urls.txt")
            with open(urls, "w") as f:
                for i in range(4):
                    f.write(f"http://127.0.0.1:{server.server_address[1]}/c/{i}.jpg\n")
            proc = subprocess.Popen([DSFS, "ingest", urls, "--dataset", "sig", "--progress",
                                     "none", "--redis", self.redis.url], env=self.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.assertTrue(StallingHandler.requested.wait(30), "ingest never fetched a URL")
            proc.send_signal(signum)
            # Released only once the signal has reached the ingest (its handler has run).
            wait_for(lambda: signal_delivered(proc.pid, signum), 30, "the signal to arrive")
            StallingHandler.release.set()
            _, err = proc.communicate(timeout=60)
        finally:
            StallingHandler.release.set()
            server.shutdown()
            server.server_close()
        self.assertNotIn("sig", self.dsfs("list").stdout.split())
        self.assertEqual(self.redis.cli("KEYS", "dsfs:sig:*").strip(), "")
        return proc.returncode, err

    def test_sigint_exits_130(self):
        code, err = self.interrupt_ingest(signal.SIGINT)
        self.assertEqual(code, 130, err)
        self.assertIn("interrupted", err)

    def test_sigterm_exits_143(self):
        code, err = self.interrupt_ingest(signal.SIGTERM)
        self.assertEqual(code, 143, err)


if __name__ == "__main__":
    unittest.main()
