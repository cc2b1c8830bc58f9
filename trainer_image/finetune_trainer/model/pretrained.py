"""What every `from_pretrained` call of the trainer passes (the model loader, the export's merge, the
GGUF conversion of the demo model).
"""

from __future__ import annotations

from typing import Any

NO_HUB_KERNELS: dict[str, Any] = {"use_kernels": False}
"""`from_pretrained` arguments for every model the trainer loads. transformers 5 kernelizes a
model by default (`use_kernels` unset) when the `kernels` package is there, as it is for
bitsandbytes: layers such as the rotary embedding are swapped for kernels downloaded from the
Hub, in inference mode, chosen by the device the weights load on. So a ZeRO-3 or QLoRA job
(weights loaded straight onto the GPU) fetched `kernels-community/rotary` at start and failed
where the Hub is out of reach ("Version 2 of 'kernels-community/rotary' is not available in
the local cache and Hugging Face Hub is in offline mode", the first GPU acceptance run), and
elsewhere ran remote code the job never asked for. Training uses transformers' own layers."""
