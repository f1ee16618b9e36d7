"""Reads a shared store's layout with pyarrow alone, as another engine would (docs/objstore.md):
refs -> stage key -> the entry's manifest -> the upload's Parquet file; run records as one dataset.
Prints {"packs": [...], "run_rows": N, "tensor_rows": N} as JSON."""

import argparse
import json

import pyarrow.dataset as ds
from pyarrow import fs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--root", required=True, help="prefix/store-v1")
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    a = ap.parse_args()
    scheme, host = a.endpoint.split("://", 1)
    s3 = fs.S3FileSystem(
        access_key=a.access_key,
        secret_key=a.secret_key,
        endpoint_override=host,
        scheme=scheme,
        region="us-east-1",
        force_virtual_addressing=False,
    )
    root = f"{a.bucket}/{a.root}"

    def read_json(path):
        with s3.open_input_stream(path) as f:
            return json.loads(f.read())

    refs = [
        read_json(i.path)
        for i in s3.get_file_info(fs.FileSelector(f"{root}/refs"))
        if i.path.endswith(".json")
    ]
    # The run records as one dataset, over the listed files (s3s-fs answers a HEAD of a "folder"
    # with an error, so the folder itself is not handed to pyarrow's discovery).
    run_files = [
        i.path
        for i in s3.get_file_info(fs.FileSelector(f"{root}/runs"))
        if i.path.endswith(".parquet")
    ]
    runs = ds.dataset(run_files, filesystem=s3, format="parquet")
    tensor_rows = 0
    for r in refs:
        key = next(s["key"] for s in r["stages"] if s["stage"] == "dequant")
        m = read_json(f"{root}/entries/{key}/manifest.json")
        path = f"{root}/entries/{key}/{m['upload']}/out/tables/tensors.parquet"
        tensor_rows += ds.dataset(path, filesystem=s3, format="parquet").count_rows()
    print(
        json.dumps(
            {
                "packs": sorted(r["name"] for r in refs),
                "run_rows": runs.count_rows(),
                "tensor_rows": tensor_rows,
            }
        )
    )


if __name__ == "__main__":
    main()
