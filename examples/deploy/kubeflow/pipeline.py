#!/usr/bin/env python3
"""A Kubeflow pipeline whose training step runs under elastic-run on a preemptible GPU pool.

    pip install kfp kfp-kubernetes          # KFP 2.x (or kfp 1.8, see build_pipeline_v1)
    python3 pipeline.py elastic_pipeline.yaml
    # upload elastic_pipeline.yaml in the Kubeflow UI, or kfp.Client().create_run_from_pipeline_package

The file imports without kfp (the kfp imports are inside the functions), so that tools and
tests can load it; building or compiling the pipeline needs kfp. What it sets up:

- the step from component.yaml (elastic-run around /opt/trainer), retried up to 5 times with a
  back-off, under Argo's retry policy "Always" (see below): each retry resumes from the newest
  checkpoint, so a retry costs at most the steps since the last checkpoint;
- the step scheduled on a spot/preemptible GPU node pool (node selector + toleration), with
  elastic-run's --grace 10 inside the 15 s GKE gives a Spot node's pods (../README.md);
- checkpoints in a bucket (checkpoint_dir, gs://elastic-checkpoints/ckpt by default), so a
  retried pod finds them on whatever node it lands: the step's pod runs as the profile's
  service account (default-editor in a Kubeflow profile), which GKE Workload Identity binds to
  a Google service account with roles/storage.objectUser on the bucket (on EKS: s3:// and IRSA);
  no key and no ReadWriteMany volume;
- run_id = the pipeline run's id, identical for every retry of the step and unique per run
  (the run's name is a display name two runs may share), so runs share one etcd. checkpoint_dir
  is a pipeline parameter: a new run given the same directory continues the training there.

Retries and preemption. KFP retries a step through Argo's retryStrategy, whose default
retryPolicy, OnFailure, retries only attempts whose main container exited non-zero ("Failed"):
an elastic-run that got the notice and exited 75 is retried, but a pod that was deleted or lost
with its node before it could exit ("Error": spot reclaim without graceful shutdown, eviction)
is not (kubeflow/pipelines#4333, #13386). retryPolicy "Always" retries both.
- KFP 1.8 (v1 SDK): ContainerOp.set_retry(num_retries, policy="Always") (kubeflow/pipelines#4858)
  compiles to that; build_pipeline_v1 uses it.
- KFP 2.x: PipelineTask.set_retry has no policy (it is proposed in kubeflow/pipelines#13386), and
  the backend applies set_retry on Argo only from the fix for #9950 (kubeflow/pipelines#11673,
  2025), with Argo's default OnFailure. build_pipeline passes policy="Always" when the installed
  SDK takes it and otherwise warns: set the policy cluster-wide in Argo's
  workflow-controller-configmap (workflowDefaults; kubeflow/pipelines#13485 adds retry defaults
  to KFP's manifests), or preempted pods that were deleted fail the run.
Every retry counts, preemptions included (KFP has no per-exit-code rule like a Kubernetes Job's
podFailurePolicy): size the budget for the preemptions you expect; elastic-run itself absorbs
worker crashes (--max-restarts) without failing the pod.
"""

import inspect
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
COMPONENT = os.path.join(HERE, "component.yaml")
GPUS_PER_HOST = 8
SPOT_LABEL = ("cloud.google.com/gke-spot", "true")   # GKE; e.g. eks.amazonaws.com/capacityType=SPOT on EKS
CHECKPOINTS = "gs://elastic-checkpoints/ckpt"   # a bucket the step's service account may write
RETRIES = 5
RETRY_POLICY = "Always"   # Argo retryPolicy: retry "Failed" (exit 75, crashes) and "Error" (pod lost)
GRACE_SECONDS = 10        # elastic-run --grace: within GKE Spot's 15 s for a node's pods


def set_retry_always(task, **backoff):
    """task.set_retry(RETRIES) with retryPolicy Always where this KFP 2.x SDK can say it."""
    if "policy" in inspect.signature(task.set_retry).parameters:
        return task.set_retry(RETRIES, policy=RETRY_POLICY, **backoff)
    warnings.warn("this kfp SDK's set_retry takes no policy: Argo's default (OnFailure) will not retry a step "
                  "whose pod was deleted by a preemption; set retryPolicy Always in Argo's "
                  "workflow-controller-configmap (workflowDefaults)", stacklevel=2)
    return task.set_retry(RETRIES, **backoff)


def build_pipeline():
    """The pipeline function, for KFP 2.x with the kfp-kubernetes extension."""
    from kfp import components, dsl
    from kfp import kubernetes

    elastic_train = components.load_component_from_file(COMPONENT)

    @dsl.pipeline(name="elastic-train",
                  description="Checkpointed, preemption-tolerant training under elastic-run")
    def elastic_pipeline(steps: int = 100000, checkpoint_dir: str = CHECKPOINTS):
        train = elastic_train(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            nnodes="1",
            nproc_per_node=GPUS_PER_HOST,
            rdzv="etcd://elastic-etcd:2379",
            checkpoint_dir=checkpoint_dir,
            log_dir="/tmp/elastic-logs",
            grace_seconds=GRACE_SECONDS,
            steps=steps,
        )
        set_retry_always(train, backoff_duration="30s", backoff_factor=2)  # preemptions count too
        train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(GPUS_PER_HOST)
        # Preemptible pool: select it and tolerate its taint.
        kubernetes.add_node_selector(train, label_key=SPOT_LABEL[0], label_value=SPOT_LABEL[1])
        kubernetes.add_toleration(train, key=SPOT_LABEL[0], operator="Equal",
                                  value=SPOT_LABEL[1], effect="NoSchedule")
        kubernetes.add_toleration(train, key="nvidia.com/gpu", operator="Exists",
                                  effect="NoSchedule")
        if hasattr(kubernetes, "enable_shared_memory"):  # kfp-kubernetes >= 1.4
            kubernetes.enable_shared_memory(train, size="16Gi")  # watchdog table, NCCL/Gloo

    return elastic_pipeline


def build_pipeline_v1():
    """The same for KFP 1.8 (ContainerOp API), as in GKE's preemptible-pool tutorials."""
    from kfp import components, dsl, gcp
    from kubernetes.client import V1Toleration

    elastic_train = components.load_component_from_file(COMPONENT)

    @dsl.pipeline(name="elastic-train")
    def elastic_pipeline(steps: int = 100000, checkpoint_dir: str = CHECKPOINTS):
        train = elastic_train(run_id="{{workflow.uid}}", nnodes="1", nproc_per_node=GPUS_PER_HOST,
                              grace_seconds=GRACE_SECONDS, checkpoint_dir=checkpoint_dir, steps=steps)
        train.set_retry(RETRIES, policy=RETRY_POLICY)
        train.set_gpu_limit(GPUS_PER_HOST)
        # Node selector cloud.google.com/gke-preemptible=true and its toleration.
        train.apply(gcp.use_preemptible_nodepool())
        train.add_toleration(V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"))

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
