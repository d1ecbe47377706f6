"""`geofence kernel ...`: the Hilbert kernel from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import hilbert_c as hk


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="kernel_command", required=True)
    enc = sub.add_parser("encode", help="Hilbert index of a lon/lat point or of a grid cell")
    enc.add_argument("a", type=float, help="lon (or x with --cell)")
    enc.add_argument("b", type=float, help="lat (or y with --cell)")
    enc.add_argument("--bits", type=int, default=26)
    enc.add_argument("--cell", action="store_true", help="a and b are grid cell coordinates")
    dec = sub.add_parser("decode", help="grid cell and cell-centre lon/lat of a Hilbert index")
    dec.add_argument("h", type=int)
    dec.add_argument("--bits", type=int, default=26)
    cov = sub.add_parser("cover", help="Hilbert ranges covering a GeoJSON Polygon/MultiPolygon")
    cov.add_argument("geojson", type=Path, help="file with a geometry or a Feature ('-' = stdin)")
    cov.add_argument("--bits", type=int, default=20)
    cov.add_argument("--max-ranges", type=int)
    cov.add_argument("--json", action="store_true", help="print the ranges as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        if args.kernel_command == "encode":
            if args.cell:
                x, y = int(args.a), int(args.b)
            else:
                x, y = hk.lonlat_to_grid(args.a, args.b, args.bits)
            print(json.dumps({"x": x, "y": y, "bits": args.bits, "h": hk.encode(x, y, args.bits)}))
        elif args.kernel_command == "decode":
            x, y = hk.decode(args.h, args.bits)
            lon, lat = hk.grid_to_lonlat(x, y, args.bits)
            print(json.dumps({"h": args.h, "bits": args.bits, "x": x, "y": y, "lon": lon, "lat": lat}))
        else:
            text = sys.stdin.read() if str(args.geojson) == "-" else args.geojson.read_text()
            covering = hk.cover(json.loads(text), args.bits, args.max_ranges)
            if args.json:
                print(json.dumps({
                    "bits": args.bits,
                    "ranges": covering.ranges.tolist(),
                    "interior": covering.interior.tolist(),
                }))
            else:
                true_area = hk.geometry_area_m2(json.loads(text))
                print(f"{len(covering)} ranges ({len(covering.merged())} merged), "
                      f"{covering.cells:,} cells at {args.bits} bits, "
                      f"interior {covering.interior_share:.1%}, "
                      f"covered/true area {covering.area_m2() / true_area:.4f}")
    except (ValueError, OSError) as exc:  # bad input: say what is wrong, no traceback
        print(f"geofence kernel: {exc}", file=sys.stderr)
        return 2
    return 0
