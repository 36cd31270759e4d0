"""`mlxctl adapters`, `mlxctl mount` and `mlxctl unmount`: a model's LoRA adapters, mounted and
unmounted without restarting its worker (/admin/models/{id}/adapters)."""

from __future__ import annotations

from pathlib import Path

from mlxd.supervisor.ctl.client import AdminClient, model_path
from mlxd.supervisor.ctl.tables import out, size, table


def cmd_adapters(args, client: AdminClient) -> int:
    body = client.get(model_path(args.model, "adapters"))
    rows = [
        (a["id"], a["path"], a.get("rank", "-"), size(a.get("bytes")), a.get("loaded", False))
        for a in body["data"]
    ]
    out(args, body, table(("MODEL", "PATH", "RANK", "SIZE", "LOADED"), rows))
    return 0


def cmd_mount(args, client: AdminClient) -> int:
    path = str(Path(args.path).expanduser().resolve())
    body = client.post(model_path(args.model, "adapters"), {"name": args.name, "path": path})
    out(args, body, f"mounted {body['id']} (rank {body['rank']}, {body['layers']} layers)")
    return 0


def cmd_unmount(args, client: AdminClient) -> int:
    body = client.delete(f"{model_path(args.model, 'adapters')}/{args.name}")
    out(args, body, f"unmounted {args.model}:{args.name}")
    return 0


def add_adapter_commands(add) -> None:
    """The three commands, through mlxctl's own `add` (name, function, help)."""
    add("adapters", cmd_adapters, "a model's LoRA adapters").add_argument("model")
    mount = add("mount", cmd_mount, "mount an mlx-lm LoRA adapter folder on a model")
    mount.add_argument("model")
    mount.add_argument("name", help="requests name it MODEL:NAME")
    mount.add_argument("path", help="the folder with adapters.safetensors")
    unmount = add("unmount", cmd_unmount, "unmount a model's LoRA adapter")
    unmount.add_argument("model")
    unmount.add_argument("name")
