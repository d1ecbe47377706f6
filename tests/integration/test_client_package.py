"""The client package as a client gets it (issue 40): `pip install ./fence/client_package` into a
venv of its own installs httpx, aio-pika and their dependencies, and none of the server's weight
(no PySpark, pandas, pyarrow, numpy, shapely, asyncpg, FastAPI); then a script in that venv,
importing only `geofence_client`, drives the live stack: a fence made, read and listed over
HTTP, read over AMQP (FenceClient, an application user), its ENTER received typed on the
application's own queue (EventStream) and found in the archive page by page, a webhook endpoint
added and removed by an admin."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from tests.integration.clients import Account, Firebase, Login, login_url, member
from tests.integration.test_fence_changes_live import HALF, Gateway

ROOT = Path(__file__).resolve().parents[2]
SERVER_WEIGHT = {"pyspark", "pandas", "pyarrow", "numpy", "shapely", "asyncpg", "fastapi", "uvicorn",
                 "osmium", "firebase-admin", "cffi"}
WHERE = (9.5700, 47.0920)  # a spot of this test's own

SCRIPT = r'''
import asyncio, json, os, sys
from geofence_client import EventStream, FenceClient, FenceEvent, GeofenceHttp

env = json.loads(sys.stdin.readline())

async def main():
    fid, obj = env["fence"], env["object"]
    lon, lat, half = env["where"][0], env["where"][1], env["half"]
    ring = [[lon - half, lat - half], [lon + half, lat - half], [lon + half, lat + half],
            [lon - half, lat + half], [lon - half, lat - half]]
    feature = {"type": "Feature", "id": fid, "geometry": {"type": "Polygon", "coordinates": [ring]},
               "properties": {}}
    async with GeofenceHttp(env["api"], env["editor"]) as api, \
            GeofenceHttp(env["api"], env["admin"]) as admin:
        made = await api.create_fence(feature)
        print(json.dumps({"created": made["id"]}), flush=True)
        listed = [f["id"] async for f in api.fences()]
        print(json.dumps({"listed": fid in listed}), flush=True)
        async with FenceClient(env["amqp"], env["editor"]) as rpc:
            print(json.dumps({"amqp_get": (await rpc.get(fid))["id"]}), flush=True)
        async with EventStream(env["amqp"], env["tenant"], env["app"], name="client-test") as stream:
            print(json.dumps({"ready": True}), flush=True)
            async def first_enter():
                async for event in stream:
                    if isinstance(event, FenceEvent) and event.object_id == obj and event.event == "enter":
                        return event
            event = await asyncio.wait_for(first_enter(), 60)
            print(json.dumps({"streamed": [event.event, event.fence_id, event.tenant, event.position.ts]}),
                  flush=True)
        for _ in range(300):
            archived = [e async for e in api.all_events(fid, limit=1)]
            if any(e.object_id == obj and e.event == "enter" for e in archived):
                print(json.dumps({"archived": len(archived)}), flush=True)
                break
            await asyncio.sleep(0.2)
        hook = await admin.add_webhook("https://hooks.example.com/geofence", kinds=["enter"], batch=10)
        print(json.dumps({"webhook": hook["secret"].startswith("whsec_"),
                          "hooks": [h["id"] for h in await admin.webhooks()] == [hook["id"]]}), flush=True)
        await admin.remove_webhook(hook["id"])
        await api.delete_fence(fid)
        print(json.dumps({"done": True}), flush=True)

asyncio.run(main())
'''


def venv_with_the_client(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=120)
    python = where / "venv" / "bin" / "python"
    source = shutil.copytree(ROOT / "fence" / "client_package", where / "client_package")  # its build/ there
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "requirements.lock"),
                           str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


async def test_the_client_installs_alone_and_drives_the_stack(
        stack: ConnectionSettings, firebase: Firebase, tenant: str, editor: Account, gateway: Login,
        app_user: Login, tmp_path: Path) -> None:
    python = await asyncio.to_thread(venv_with_the_client, tmp_path)
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, check=True, timeout=120)
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"geofence-client", "httpx", "aio-pika"} <= installed, installed
    assert not installed & SERVER_WEIGHT, installed & SERVER_WEIGHT

    tag = uuid.uuid4().hex[:8]
    fid, obj = f"client-{tag}", f"client-obj-{tag}"
    env = {"api": stack["api"], "amqp": login_url(stack, app_user, t.FENCES_VHOST), "editor": editor.token,
           "admin": member(firebase, tenant, "admin").token, "tenant": tenant, "app": app_user.name,
           "fence": fid, "object": obj, "where": WHERE, "half": HALF}
    pipe = asyncio.subprocess.PIPE
    alone = {**os.environ, "PYTHONPATH": ""}  # the venv's own packages only, from a folder of its own
    proc = await asyncio.create_subprocess_exec(str(python), "-c", SCRIPT, stdin=pipe, stdout=pipe,
                                                stderr=pipe, cwd=tmp_path, env=alone)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(json.dumps(env).encode() + b"\n")
    await proc.stdin.drain()
    said: dict[str, Any] = {}
    try:
        async with Gateway(stack, gateway) as gw:
            while "done" not in said:
                line = await asyncio.wait_for(proc.stdout.readline(), 90)
                if not line:
                    break
                said.update(json.loads(line))
                if line.startswith(b'{"ready"'):
                    t0 = float(int(time.time()))
                    await gw.send((obj, WHERE[0] - 3 * HALF, WHERE[1], t0), (obj, *WHERE, t0 + 1))
    finally:
        if proc.returncode is None:
            proc.kill()
        err = (await proc.stderr.read()).decode()
        await proc.wait()
    assert said.get("done"), (said, err[-3000:])
    assert said["created"] == fid and said["listed"] is True and said["amqp_get"] == fid
    assert said["streamed"][:3] == ["enter", fid, tenant] and isinstance(said["streamed"][3], float)
    assert said["archived"] >= 1 and said["webhook"] is True and said["hooks"] is True
