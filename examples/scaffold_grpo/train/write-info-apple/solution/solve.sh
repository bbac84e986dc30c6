#!/bin/bash
echo apple > /workspace/info.txt
