"""What LoadGen's SUT runs: the compiled engine in this process, or a served model over
HTTP. Both stage the tool's inputs once (the QSL's load): the engine's request slots hold the
measured input (as ``benchmark_app`` and the tool's throughput scenario fill each request
once), the HTTP driver holds each sample's request body already serialized, so a run
measures the engine, or the server and its parsing, never the client building requests."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlparse

import numpy as np

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.loadgen.settings import QSL_SAMPLES

#: concurrent connections of the HTTP driver in Offline and Server (the served figure
#: includes the server's own queueing of them)
HTTP_CLIENTS = 4
#: seconds the HTTP driver waits on one request
HTTP_TIMEOUT_S = 60.0


class EngineRunner:
    """An engine of batch size ``batch``, its slots the runtime's parallel requests."""

    def __init__(self, engine, inputs: np.ndarray, batch: int) -> None:
        self.engine = engine
        self.batch = batch
        self.slots = max(1, int(getattr(engine, "parallel_requests", 1)))
        engine.prepare(inputs)

    def run(self, slot: int, indices: list[int]) -> None:
        self.engine.infer_in(slot)


class HttpRunner:
    """A running ``mlflow-ngraph serve`` (MLflow's scoring server): each run is one POST to
    ``/invocations`` of exactly ``batch`` samples (a short batch padded with its last)."""

    def __init__(self, url: str, samples: np.ndarray, batch: int, slots: int = HTTP_CLIENTS):
        parsed = urlparse(url)
        self.url = url
        self.https = parsed.scheme == "https"
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port
        self.path = (parsed.path.rstrip("/") or "") + "/invocations"
        self.batch = batch
        self.slots = slots
        self.bodies = [json.dumps(row.tolist()) for row in samples[:QSL_SAMPLES]]
        self.local = threading.local()

    def connection(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self.local.conn = kind(self.host, self.port, timeout=HTTP_TIMEOUT_S)
        return conn

    def run(self, slot: int, indices: list[int]) -> None:
        rows = [self.bodies[i % len(self.bodies)] for i in indices]
        rows += rows[-1:] * (self.batch - len(rows))
        body = '{"inputs": [' + ",".join(rows) + "]}"
        status, answer = self._post(body)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {answer[:200].decode(errors='replace')}")

    def _post(self, body: str) -> tuple[int, bytes]:
        """One POST on this thread's kept-alive connection. A server closes an idle one (a
        pause between two LoadGen runs outlasts uvicorn's 5 s keep-alive): a reused
        connection that fails is replaced and the request sent once more on a fresh one,
        as HTTP clients do; a fresh one that fails is the run's failure."""
        for attempt in (1, 2):
            conn = self.connection()
            reused = conn.sock is not None
            try:
                conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                self.local.conn = None  # a fresh connection next time
                conn.close()
                if attempt == 2 or not reused:
                    raise
        raise AssertionError("unreachable")

    def check(self) -> None:
        """One request: a URL nothing answers, or a server that refuses this model's input,
        is one line before LoadGen starts."""
        try:
            self.run(0, [0])
        except (OSError, http.client.HTTPException) as exc:
            raise NgraphError(
                f"nothing answers at {self.url} ({type(exc).__name__}: {exc}): start "
                "`mlflow-ngraph serve MODEL_URI -p PORT` there first, or correct --url"
            ) from None
        except RuntimeError as exc:
            raise NgraphError(
                f"{self.url} refused a request of {self.batch} sample(s) of this model: {exc} "
                "(--model must be the served model; --max-batch its batch size)"
            ) from None


def probe(url: str, timeout_s: float = 5.0) -> None:
    """Something answers HTTP at ``url`` (MLflow's scoring server's ``/ping``), or one line
    before any engine is built."""
    parsed = urlparse(url)
    kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    conn = kind(parsed.hostname or "127.0.0.1", parsed.port, timeout=timeout_s)
    try:
        conn.request("GET", (parsed.path.rstrip("/") or "") + "/ping")
        conn.getresponse().read()
    except (OSError, http.client.HTTPException) as exc:
        raise NgraphError(
            f"nothing answers at {url} ({type(exc).__name__}: {exc}): start "
            "`mlflow-ngraph serve MODEL_URI -p PORT` there first, or correct --url"
        ) from None
    finally:
        conn.close()
