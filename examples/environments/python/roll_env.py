"""Serve an environment to roll-cpp over the external-environment protocol.

The protocol is src/rpc/environment.proto (service roll.env.v1.EnvironmentService).
This module is all a Python environment needs: subclass Episode, then call
serve() with a factory. roll-cpp starts the server itself when the config
says `env_type: external` with `command=...` (the address to serve on is
in $ROLL_ENV_ADDRESS, a Unix socket), or connects to a server already
running with `address=...`.

Needs grpcio and protobuf (Debian: python3-grpcio, python3-protobuf) and
protoc (protobuf-compiler): the message classes are generated from the
.proto at start-up, so they always match it. $ROLL_ENV_PROTO names the
.proto when this file is not inside the roll-cpp tree.
"""

import argparse
import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc

SERVICE = "roll.env.v1.EnvironmentService"


def _load_messages():
    proto = Path(os.environ.get("ROLL_ENV_PROTO") or
                 Path(__file__).resolve().parents[3] / "src" / "rpc" / "environment.proto")
    if not proto.is_file():
        sys.exit(f"roll_env: the protocol file {proto} is missing (set ROLL_ENV_PROTO)")
    # Generated into a temporary directory that is gone again once the
    # module is imported, so no exit path (a signal included) leaves it.
    out = tempfile.mkdtemp(prefix="roll_env_pb2_")
    try:
        subprocess.run(["protoc", f"--proto_path={proto.parent}", f"--python_out={out}", str(proto)], check=True)
        sys.path.insert(0, out)
        try:
            return importlib.import_module(proto.stem + "_pb2")
        finally:
            sys.path.remove(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


pb = _load_messages()


@dataclasses.dataclass
class StepResult:
    observation: str
    reward: float = 0.0
    done: bool = False
    success: bool = False
    truncated: bool = False
    action_valid: bool = True


class Episode:
    """One episode. Must be a pure function of the reset seed and the
    actions since: roll-cpp replays episodes after a worker died."""

    def reset(self, seed: int) -> str:
        """Starts the episode from `seed`; returns the first observation."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Applies the agent's text (e.g. "<answer>Left</answer>")."""
        raise NotImplementedError


class Description:
    def __init__(self, instructions, actions=()):
        self.instructions = instructions
        self.actions = list(actions)


def answer(text: str) -> str:
    """The text inside the last <answer>...</answer>, else the whole text; stripped."""
    open_at = text.rfind("<answer>")
    if open_at >= 0:
        text = text[open_at + len("<answer>"):]
        close_at = text.find("</answer>")
        if close_at >= 0:
            text = text[:close_at]
    return text.strip()


class _Service:
    def __init__(self, describe, make_episode):
        self._describe = describe
        self._make = make_episode
        self._episodes = {}
        self._lock = threading.Lock()

    def Describe(self, req, ctx):
        d = self._describe(dict(req.options))
        return pb.DescribeReply(instructions=d.instructions, actions=d.actions)

    def Reset(self, req, ctx):
        episode = self._make(dict(req.options))
        observation = episode.reset(req.seed)
        with self._lock:
            self._episodes[req.episode_id] = episode
        return pb.ResetReply(observation=observation)

    def Step(self, req, ctx):
        with self._lock:
            episode = self._episodes.get(req.episode_id)
        if episode is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"episode '{req.episode_id}' is not open (reset it first)")
        r = episode.step(req.action)
        return pb.StepReply(observation=r.observation, reward=r.reward, done=r.done, success=r.success,
                            truncated=r.truncated, action_invalid=not r.action_valid)

    def Close(self, req, ctx):
        with self._lock:
            self._episodes.pop(req.episode_id, None)
        return pb.CloseReply()


def serve(describe, make_episode, address=None, workers=8):
    """Serves until terminated. `describe(options)` returns a Description,
    `make_episode(options)` a new Episode; `options` are the env_options
    roll-cpp does not read itself, as strings."""
    if address is None:
        parser = argparse.ArgumentParser()
        parser.add_argument("--address", default=os.environ.get("ROLL_ENV_ADDRESS"),
                            help="where to serve (default: $ROLL_ENV_ADDRESS), e.g. unix:/tmp/env.sock or "
                                 "127.0.0.1:50051")
        address = parser.parse_args().address
    if not address:
        sys.exit("roll_env: no address to serve on (--address or $ROLL_ENV_ADDRESS)")
    service = _Service(describe, make_episode)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(service, name),
            request_deserializer=getattr(pb, name + "Request").FromString,
            response_serializer=getattr(pb, name + "Reply").SerializeToString)
        for name in ("Describe", "Reset", "Step", "Close")
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    if server.add_insecure_port(address) == 0:
        sys.exit(f"roll_env: cannot serve on {address}")
    server.start()
    print(f"roll_env: serving on {address}", flush=True)
    server.wait_for_termination()
