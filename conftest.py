"""Repository-wide pytest setup: MindSpore graph mode on CPU for tests and doctests alike."""
import mindspore as ms

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
