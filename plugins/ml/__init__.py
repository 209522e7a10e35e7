"""The ML plugin: gradient-descent linear regression and DynamicDotGAT (issue 11, in progress)."""
