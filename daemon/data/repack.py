"""`so101d dataset pack ROOT`: rewrite a dataset into LeRobot v3's packed layout, crash-safely.

Datasets recorded before packing hold one parquet and one MP4 per camera per episode (each commit
was its own LeRobot session). They keep loading and appending as they are; this repacks one:
every episode is cut out of its files (rows by episode index, video by its timestamp range, stream
copy: no re-encoding), staged like a freshly recorded episode and committed by DatasetStore into a
new dataset beside the old one (``.<name>.so101d-pack``). Only when all of it is committed is
the old folder renamed away (``.<name>.so101d-unpacked``) and the new one renamed into place; the
old one is then deleted. A crash while building leaves the original untouched (the partial copy is
discarded by the next run); a crash between the two renames is finished by the next run.
Episode tags, tasks, per-frame timing files and the size targets in info.json are carried over.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from daemon.data.schema import IMAGE_KEY_PREFIX, read_episode_tags
from daemon.data.store import TIMING_DIR, DatasetStore, StoreConfig, staging_dir, write_json_atomic


def pack_dirs(root: Path) -> tuple[Path, Path]:
    return root.parent / f".{root.name}.so101d-pack", root.parent / f".{root.name}.so101d-unpacked"


def finish_interrupted_swap(root: Path) -> str | None:
    """A crash between the two renames: the packed copy is complete, put it in place."""
    new, old = pack_dirs(root)
    if not root.exists() and old.exists() and (new / "meta" / "info.json").exists():
        new.rename(root)
    if root.exists() and old.exists():
        shutil.rmtree(old)
        return f"finished an interrupted repack of {root}"
    return None


def cut_video(src: Path, from_s: float, to_s: float, dst: Path) -> int:
    """The packets of one episode (``from_s`` <= t < ``to_s``) as their own MP4, timestamps from 0.

    Returns the number of frames. Stream copy: the episode must start on a keyframe (LeRobot's
    writers start every episode's video with one)."""
    import av

    dst.parent.mkdir(parents=True, exist_ok=True)
    frames = 0
    with av.open(str(src)) as inp:
        ist = inp.streams.video[0]
        tb = ist.time_base
        if tb is None:  # an MP4 video stream always has one; a file without is not ours
            raise ValueError(f"{src}: video stream has no time base")
        half_frame = 0.5 / float(ist.average_rate or 30)
        lo, hi = from_s - half_frame, to_s - half_frame
        out = av.open(str(dst), "w", format="mp4")
        try:
            ost = out.add_stream_from_template(ist)
            ost.time_base = tb
            offset = None
            inp.seek(max(0, int((from_s - 1.0) / tb)), stream=ist, backward=True)
            for pkt in inp.demux(ist):
                if pkt.pts is None:
                    continue
                t = float(pkt.pts * tb)
                if t < lo:
                    continue
                if t >= hi:
                    break
                if offset is None:
                    if not pkt.is_keyframe:
                        raise ValueError(
                            f"{src}: the episode at {from_s:.3f} s does not start on a keyframe; "
                            "repacking it would need re-encoding"
                        )
                    offset = pkt.dts if pkt.dts is not None else pkt.pts
                pkt.pts -= offset
                pkt.dts = (pkt.dts - offset) if pkt.dts is not None else pkt.pts
                pkt.stream = ost
                out.mux(pkt)
                frames += 1
        finally:
            out.close()
    return frames


def _raw_video_stats(ep_row: dict[str, Any], key: str, scale: float = 255.0) -> dict[str, list] | None:
    """meta/episodes' per-episode image stats back in the writer's form (0..255, per channel; a
    depth map's, ``scale`` 1, are in its unit already)."""
    prefix = f"stats/{key}/"
    stats = {k[len(prefix) :]: v for k, v in ep_row.items() if k.startswith(prefix)}
    if not stats:
        return None
    out = {}
    for k, v in stats.items():
        arr = np.asarray(v, dtype=np.float64)
        out[k] = arr.reshape(-1).tolist() if k == "count" else (arr.reshape(-1) * scale).tolist()
    return out


def pack(root: Path, repo_id: str = "local/so101d", log=print) -> dict[str, Any]:
    """Repack ``root`` into LeRobot's packed layout. Returns a summary."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from lerobot.datasets.io_utils import load_episodes

    root = root.expanduser().resolve()
    note = finish_interrupted_swap(root)
    if note:
        log(note)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise FileNotFoundError(f"{root} is not a LeRobot dataset (no meta/info.json)")
    info = json.loads(info_path.read_text())
    videos = {k: f for k, f in info["features"].items() if f.get("dtype") == "video"}
    is_depth = {k: bool((f.get("info") or {}).get("is_depth_map")) for k, f in videos.items()}
    cameras = [
        (k[len(IMAGE_KEY_PREFIX) :], int(f["shape"][0]), int(f["shape"][1]))
        for k, f in videos.items()
        if not is_depth[k]
    ]
    # a depth map is its camera's "<camera>_depth" stream (schema.depth_key)
    depth_cameras = [k[len(IMAGE_KEY_PREFIX) :].removesuffix("_depth") for k in videos if is_depth[k]]
    cfg_kwargs = dict(
        repo_id=repo_id,
        fps=int(info["fps"]),
        cameras=cameras,
        depth_cameras=depth_cameras,
        robot_type=info.get("robot_type") or "so101_follower",
        chunks_size=int(info["chunks_size"]),
        data_files_size_in_mb=info["data_files_size_in_mb"],
        video_files_size_in_mb=info["video_files_size_in_mb"],
    )
    owner = DatasetStore(StoreConfig(root=str(root), **cfg_kwargs))
    owner.take_ownership()  # a recording daemon on this dataset is refused, and refuses us
    new, old = pack_dirs(root)
    try:
        for d in (new, staging_dir(new)):
            shutil.rmtree(d, ignore_errors=True)  # a previous run's partial copy
        store = DatasetStore(StoreConfig(root=str(new), **cfg_kwargs))
        store.repair()
        episodes = load_episodes(root)
        tags = read_episode_tags(root)
        files_before = sum(1 for p in root.rglob("*") if p.is_file())
        t0 = time.monotonic()
        data_cache: tuple[Path, Any] | None = None
        for e in range(len(episodes)):
            ep = episodes[e]
            index = int(ep["episode_index"])
            stage = store.staging / f"ep-repack-{index:06d}"
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True)  # a dataset without cameras has no video to create it
            data_path = root / info["data_path"].format(
                chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"]
            )
            if data_cache is None or data_cache[0] != data_path:
                data_cache = (data_path, pq.read_table(data_path))  # one data file in memory at a time
            table = data_cache[1]
            rows = table.filter(pc.equal(table["episode_index"], index)).to_pydict()
            n = len(rows["frame_index"])
            if n != int(ep["length"]):
                raise ValueError(f"episode {index}: {n} rows in {data_path.name}, {ep['length']} in meta/episodes")
            video_stats = {}
            for name, depth in store.cfg.video_streams():
                key = IMAGE_KEY_PREFIX + name
                src = root / info["video_path"].format(
                    video_key=key,
                    chunk_index=ep[f"videos/{key}/chunk_index"],
                    file_index=ep[f"videos/{key}/file_index"],
                )
                got = cut_video(
                    src,
                    float(ep[f"videos/{key}/from_timestamp"]),
                    float(ep[f"videos/{key}/to_timestamp"]),
                    stage / name / "video.mp4",
                )
                if got != n:
                    raise ValueError(f"episode {index}, {key}: {got} video frames for {n} rows")
                full = load_episode_stats(root, ep, key, 1.0 if depth else 255.0)
                video_stats[name] = full
            np.savez(
                stage / "rows.npz",
                state=np.asarray(rows["observation.state"], np.float32),
                action=np.asarray(rows["action"], np.float32),
                teleop=np.asarray(rows["teleop.action"], np.float32),
            )
            timing = root / TIMING_DIR / f"episode_{index:06d}.npz"
            if timing.exists():
                shutil.copyfile(timing, stage / "timing.npz")
            else:
                np.savez(stage / "timing.npz", grid_s=np.arange(n, dtype=np.float64) / int(info["fps"]))
            tag = asdict(tags[index]) if index in tags else {"source": {}}
            tag.pop("episode_index", None)
            uid = str(tag.get("source", {}).get("recording_uid") or f"repack-{index:06d}")
            tasks = list(ep["tasks"])
            write_json_atomic(
                stage / "episode.json",
                {"uid": uid, "task": tasks[0], "frames": n, "tag": tag, "video_stats": video_stats},
            )
            store.commit(stage)
        store.release_ownership()
        shutil.rmtree(staging_dir(new), ignore_errors=True)
        # swap: both renames are atomic; finish_interrupted_swap completes a crash in between
        root.rename(old)
        new.rename(root)
        shutil.rmtree(old)
        files_after = sum(1 for p in root.rglob("*") if p.is_file())
        return {
            "episodes": len(episodes),
            "files_before": files_before,
            "files_after": files_after,
            "seconds": round(time.monotonic() - t0, 1),
        }
    finally:
        owner.release_ownership()


def load_episode_stats(root: Path, ep: dict[str, Any], key: str, scale: float = 255.0) -> dict[str, list] | None:
    """This episode's image stats for ``key`` from its meta/episodes file (load_episodes drops them)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = (
        root
        / "meta"
        / "episodes"
        / f"chunk-{int(ep['meta/episodes/chunk_index']):03d}"
        / f"file-{int(ep['meta/episodes/file_index']):03d}.parquet"
    )
    cols = [c for c in pq.read_schema(path).names if c.startswith(f"stats/{key}/")] + ["episode_index"]
    t = pq.read_table(path, columns=cols)
    row = t.filter(pc.equal(t["episode_index"], int(ep["episode_index"]))).to_pylist()
    return _raw_video_stats(row[0], key, scale) if row else None
