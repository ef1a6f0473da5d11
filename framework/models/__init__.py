"""Models take the dataset's input shape and class count; configs in conf/model/ name them by _target_."""
