#!/usr/bin/env python3
"""A Kubeflow pipeline whose training step runs under elastic-run on a preemptible GPU pool.

    pip install kfp kfp-kubernetes          # KFP 2.x (or kfp 1.8, see build_pipeline_v1)
    python3 pipeline.py elastic_pipeline.yaml
    # upload elastic_pipeline.yaml in the Kubeflow UI, or kfp.Client().create_run_from_pipeline_package

The file imports without kfp (the kfp imports are inside the functions), so that tools and
tests can load it; building or compiling the pipeline needs kfp. What it sets up:

- the step from component.yaml (elastic-run around /opt/trainer), retried up to 5 times
  (set_retry(5)) with a back-off: each retry resumes from the newest checkpoint, so a retry
  costs at most the steps since the last checkpoint;
- the step scheduled on a spot/preemptible GPU node pool (node selector + toleration);
- a ReadWriteMany PVC at /shared for checkpoints and logs (kubernetes/job.yaml creates one named
  elastic-shared), so a retried pod finds the checkpoints and the logs of the preempted one;
- run_id = the pipeline run's id, identical for every retry of the step and unique per run
  (the run's name is a display name two runs may share). checkpoint_dir is a pipeline
  parameter: a new run given the same directory continues the training there.

KFP counts every failed attempt against set_retry, preemptions (exit 75) included: it has no
per-exit-code rule like a Kubernetes Job's podFailurePolicy. Size the retry budget for the
preemptions you expect; elastic-run itself absorbs worker crashes (--max-restarts) without
failing the pod.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
COMPONENT = os.path.join(HERE, "component.yaml")
GPUS_PER_HOST = 8
SPOT_LABEL = ("cloud.google.com/gke-spot", "true")   # GKE; e.g. eks.amazonaws.com/capacityType=SPOT on EKS
SHARED_PVC = "elastic-shared"


def build_pipeline():
    """The pipeline function, for KFP 2.x with the kfp-kubernetes extension."""
    from kfp import components, dsl
    from kfp import kubernetes

    elastic_train = components.load_component_from_file(COMPONENT)

    @dsl.pipeline(name="elastic-train",
                  description="Checkpointed, preemption-tolerant training under elastic-run")
    def elastic_pipeline(steps: int = 100000, checkpoint_dir: str = "/shared/ckpt"):
        train = elastic_train(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            nnodes="1",
            nproc_per_node=GPUS_PER_HOST,
            rdzv="etcd://elastic-etcd:2379",
            checkpoint_dir=checkpoint_dir,
            log_dir="/shared/logs",
            steps=steps,
        )
        train.set_retry(5, backoff_duration="30s", backoff_factor=2)  # preemptions count too
        train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(GPUS_PER_HOST)
        # Preemptible pool: select it and tolerate its taint.
        kubernetes.add_node_selector(train, label_key=SPOT_LABEL[0], label_value=SPOT_LABEL[1])
        kubernetes.add_toleration(train, key=SPOT_LABEL[0], operator="Equal",
                                  value=SPOT_LABEL[1], effect="NoSchedule")
        kubernetes.add_toleration(train, key="nvidia.com/gpu", operator="Exists",
                                  effect="NoSchedule")
        kubernetes.mount_pvc(train, pvc_name=SHARED_PVC, mount_path="/shared")
        if hasattr(kubernetes, "enable_shared_memory"):  # kfp-kubernetes >= 1.4
            kubernetes.enable_shared_memory(train, size="16Gi")  # watchdog table, NCCL/Gloo

    return elastic_pipeline


def build_pipeline_v1():
    """The same for KFP 1.8 (ContainerOp API), as in GKE's preemptible-pool tutorials."""
    from kfp import components, dsl, gcp
    from kubernetes.client import V1Toleration, V1Volume, V1VolumeMount
    from kubernetes.client import V1PersistentVolumeClaimVolumeSource

    elastic_train = components.load_component_from_file(COMPONENT)

    @dsl.pipeline(name="elastic-train")
    def elastic_pipeline(steps: int = 100000, checkpoint_dir: str = "/shared/ckpt"):
        train = elastic_train(run_id="{{workflow.uid}}", nnodes="1", nproc_per_node=GPUS_PER_HOST,
                              checkpoint_dir=checkpoint_dir, steps=steps)
        train.set_retry(5)
        train.set_gpu_limit(GPUS_PER_HOST)
        # Node selector cloud.google.com/gke-preemptible=true and its toleration.
        train.apply(gcp.use_preemptible_nodepool())
        train.add_toleration(V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"))
        train.add_volume(V1Volume(name="shared", persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
            claim_name=SHARED_PVC)))
        train.container.add_volume_mount(V1VolumeMount(name="shared", mount_path="/shared"))

    return elastic_pipeline


def main(argv):
    out = argv[1] if len(argv) > 1 else "elastic_pipeline.yaml"
    try:
        import kfp
    except ImportError:
        print("pipeline.py: compiling needs kfp (pip install kfp kfp-kubernetes)", file=sys.stderr)
        return 2
    if kfp.__version__.startswith("1."):
        kfp.compiler.Compiler().compile(build_pipeline_v1(), out)
    else:
        from kfp import compiler
        compiler.Compiler().compile(build_pipeline(), package_path=out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
