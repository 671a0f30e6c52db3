"""yolo-cl: Darknet-compatible YOLO inference on OpenCL.

    >>> import yolo_cl, cv2
    >>> det = yolo_cl.Detector("yolov3-tiny")
    >>> det.detect(cv2.imread("dog.jpg"))
"""
from .detector import Detector
from .draw import draw
from .fleet import Fleet, QueueFull
from .errors import CfgError, DeviceError, ImageError, LimitError, WeightsError, YoloClError
from .postprocess import Detection
from . import ops

__version__ = "0.1.0"
__all__ = ["Detector", "Detection", "YoloClError", "CfgError", "WeightsError", "ImageError", "DeviceError",
           "LimitError", "Fleet", "QueueFull", "draw", "ops", "__version__"]
