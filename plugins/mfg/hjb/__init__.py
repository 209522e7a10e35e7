"""The backward HJB solver of the MFG plugin (``mfg.hjb_fdm``): implicit upwind finite differences."""
