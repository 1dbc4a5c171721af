"""Ray backends: ``ray`` (Ray's Job API + Ray Train, on ``RAY_ADDRESS`` or a local Ray) and ``kuberay``
(a KubeRay ``RayJob`` on Kubernetes, served by KServe)."""
