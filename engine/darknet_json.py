"""Detections in Darknet's ``-out`` JSON layout, shared by ``yolo-cl detect --json`` and the server.

Darknet groups the classes of one box together (best first), orders boxes left to right and
gives coordinates relative to the image; ``json_frame`` builds one such frame object.
"""
from __future__ import annotations


def group_by_box(detections: list) -> list:
    """Detections of one box together, best class first then the others by class id; boxes left to right.

    This is the order of Darknet's draw_detections_v3; classes named ``dont_show…`` are hidden as there.
    """
    groups: dict = {}
    for d in detections:
        if not d.label.startswith("dont_show"):
            groups.setdefault(tuple(d.box), []).append(d)
    out = []
    for ds in groups.values():
        best = max(ds, key=lambda d: d.confidence)
        out.append([best] + sorted((d for d in ds if d is not best), key=lambda d: d.class_id))
    out.sort(key=lambda g: g[0].box[0])
    return out


def darknet_box(d) -> tuple:
    """(x1, y1, x2, y2) in pixels as Darknet prints it: unclipped when known."""
    return d.unclipped if d.unclipped is not None else d.box


def json_frame(frame_id: int, filename: str, detections: list, img_w: int, img_h: int, fit: str) -> dict:
    """One frame in Darknet's ``-out`` JSON layout (coordinates relative to the image), plus ``resize``."""
    objects = []
    for group in group_by_box(detections):
        x1, y1, x2, y2 = darknet_box(group[0])
        rel = {"center_x": round((x1 + x2) / 2 / img_w, 6), "center_y": round((y1 + y2) / 2 / img_h, 6),
               "width": round((x2 - x1) / img_w, 6), "height": round((y2 - y1) / img_h, 6)}
        for d in sorted(group, key=lambda d: d.class_id):
            objects.append({"class_id": d.class_id, "name": d.label, "relative_coordinates": dict(rel),
                            "confidence": round(float(d.confidence), 6)})
    return {"frame_id": frame_id, "filename": filename, "objects": objects, "resize": fit}
