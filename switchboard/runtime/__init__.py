"""The runtime layer both channels load their models through: which runtime runs a model
(``choice.RuntimeChoice``: onnxruntime, torch:cpu, torch:cuda or triton:<model>), ONNX
Runtime's sessions, threads and prepared weights (``onnx``), and PyTorch's device, dtype and
CUDA graphs (``pytorch``). What a model is (a chat decoder, a recognizer) stays with its channel."""
