"""The scoring server of ``mlflow-ngraph serve``: MLflow's own, with one-line refusals.

An engine takes one fixed input shape (its batch size included), and its logged model's
signature says so. MLflow's scoring server refuses another shape with HTTP 400, but its
``message`` repeats the whole request array and the schema over many lines. This app is
MLflow's (``mlflow.pyfunc.scoring_server.init``, the same routes and parsing) with one
middleware that rewrites the ``message`` of a refused request to one line naming the
expected shape, e.g. ``input shape (2, 3, 32, 32) is not the engine's (1, 3, 32, 32): it
takes batches of exactly 1 (send 1 sample per request)``.
"""

from __future__ import annotations

import json
import os
import re

SHAPE = re.compile(r"Shape of input (\([^)]*\)) does not match expected shape (\([^)]*\))")
DTYPE = re.compile(r"dtype of input (\S+) does not match expected dtype (\S+)")
#: a message longer than this is cut (one line, readable in a terminal and a log)
MAX_MESSAGE = 300


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"-?\d+", text))


def refusal(message: str) -> str:
    """One line saying why a request was refused, from MLflow's message."""
    match = SHAPE.search(message)
    if match:
        got, want = _shape(match[1]), _shape(match[2])
        batch = want[0] if want else None
        if batch and batch > 0 and got[1:] == want[1:]:
            return (
                f"input shape {got} is not the engine's {want}: it takes batches of exactly "
                f"{batch} (send {batch} sample{'s' if batch != 1 else ''} per request)"
            )
        return f"input shape {got} is not the engine's {want}"
    match = DTYPE.search(message)
    if match:
        return f"input dtype {match[1]} is not the engine's {match[2]}"
    tail = message.rsplit("Error: ", 1)[-1].strip()
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return (lines[0] if lines else "the request was refused")[:MAX_MESSAGE]


async def one_line_refusals(request, call_next):
    """A refused ``/invocations`` request (HTTP 400) answers ``{"error_code", "message"}``
    with a one-line message (no request echo, no stack trace)."""
    from fastapi.responses import Response

    response = await call_next(request)
    if request.url.path != "/invocations" or response.status_code != 400:
        return response
    body = b"".join([chunk async for chunk in response.body_iterator])
    try:
        error = json.loads(body)
        message = str(error.get("message", ""))
    except (ValueError, AttributeError):
        error, message = {}, body.decode("utf-8", "replace")
    answer = {
        "error_code": error.get("error_code", "BAD_REQUEST"),
        "message": refusal(message),
    }
    return Response(json.dumps(answer), status_code=400, media_type="application/json")


def create_app():
    """MLflow's scoring app for the model in ``__pyfunc_model_path__`` (as ``mlflow models
    serve`` sets it), with :func:`one_line_refusals`; uvicorn's ``--factory`` target."""
    from mlflow.pyfunc import scoring_server

    model = scoring_server.load_model_with_mlflow_config(
        os.environ[scoring_server._SERVER_MODEL_PATH]
    )
    app = scoring_server.init(model)
    app.middleware("http")(one_line_refusals)
    return app
