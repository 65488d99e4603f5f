"""vLLM as a policy: colocated (``policy``), served by ``vllm serve`` replicas (``server``), and the
weight transfer between the trainer and the engines (``transfer``, with ``gloo`` loaded by vLLM)."""
