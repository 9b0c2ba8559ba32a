"""The head of a local Ray cluster, in a process of its own: ``python -m
mlflow_ngraph.cluster.head ARGS FOLDER``, ARGS the JSON of the head node's arguments
(``ray.cluster_utils.Cluster``'s ``head_node_args``), FOLDER the cluster's temp folder (Ray's
``temp_dir`` is in it).

Started by :func:`mlflow_ngraph.cluster.sweep.start_local_cluster` with an environment of
its own (``HOME`` and ``RAY_TMPDIR`` are FOLDER), so that nothing of the starting process's
environment is changed. Once the head is up it writes its GCS address to
``FOLDER/head.address``; then it runs until its stdin ends (the cluster is shut down, or the
process that started it died), stops the head's processes and removes FOLDER.
"""

import json
import os
import shutil
import sys

#: the file of the temp folder that holds the head's GCS address once it is up
ADDRESS_FILE = "head.address"


def main(argv: list) -> None:
    from ray.cluster_utils import Cluster

    args, folder = json.loads(argv[1]), argv[2]
    # a head that does not start: the traceback goes to stderr, which the starting process
    # reads (it removes the folder then)
    cluster = Cluster(initialize_head=True, head_node_args=args)
    try:
        tmp = os.path.join(folder, ADDRESS_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(cluster.address)
        os.replace(tmp, os.path.join(folder, ADDRESS_FILE))
        sys.stdin.read()
    finally:
        cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
