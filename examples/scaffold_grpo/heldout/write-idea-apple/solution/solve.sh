#!/bin/bash
echo apple > /workspace/idea.txt
