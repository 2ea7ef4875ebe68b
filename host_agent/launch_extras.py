"""Launch-related calls written out by hand on the host: cuOccupancyMaxActiveClusters (a launch configuration)
and cuTensorMapEncodeTiled (a TMA descriptor). A mixin of executor.CudaExecutor, registered on its HOST
handlers."""
from __future__ import annotations


class LaunchExtraCalls:
    """cuOccupancyMaxActiveClusters, cuTensorMapEncodeTiled (being written: issue 13)."""
